"""Task-specific distillation's loss (``finetune <task>`` with ``model.teacher.restore_from_path``):

loss = ``alpha_task`` x the task's own loss on the gold labels
     + ``alpha_kl`` x KL(teacher || student) of the temperature-softened task logits, x T^2 if ``kl_t2_scaling``

over what each task predicts (``KINDS``):

- ``tokens`` (NER): a distribution over the labels at every labelled token (the positions the task loss reads,
  label != -100), mean over those tokens;
- ``sequence`` (RE, single-label classify): a distribution over the labels per example, mean over examples;
- ``multilabel`` (multi-label classify, HoC): an independent Bernoulli per label (sigmoid), the KL summed over
  the two outcomes, mean over examples x labels;
- ``span`` (QA): the start and the end logits, each a distribution over the sequence's real tokens (padding left
  out), mean over examples, then the mean of start and end (as the task's span loss averages them).

The task heads are replicated on every tensor-parallel rank (``models/heads.py``), so the logits here are whole on
every rank and the KL is plain torch: it does not depend on the TP size. The teacher's logits carry no gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KINDS = ("tokens", "sequence", "multilabel", "span")
REPORT_KEYS = ("task_loss", "kl_loss")


def _kl_rows(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) along the last dimension, one value per row (float32)."""
    log_q = F.log_softmax(student.float() / temperature, dim=-1)
    log_p = F.log_softmax(teacher.detach().float() / temperature, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def _mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.float()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def task_kl_loss(kind: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict,
                 temperature: float, t2_scaling: bool) -> torch.Tensor:
    """The KL term for a task of ``kind`` (see the module's docstring); ``batch``: the task's collated batch
    (``labels`` for tokens, ``attention_mask`` for span)."""
    if kind == "tokens":
        per = _kl_rows(student_logits, teacher_logits, temperature)
        kl = _mean(per, batch["labels"] != -100)
    elif kind == "sequence":
        kl = _kl_rows(student_logits, teacher_logits, temperature).mean()
    elif kind == "multilabel":
        # each label a two-way softmax over (logit, 0): sigmoid(x / T) and its complement
        s, t = student_logits.float(), teacher_logits.detach().float()
        kl = _kl_rows(torch.stack((s, torch.zeros_like(s)), -1), torch.stack((t, torch.zeros_like(t)), -1),
                      temperature).mean()
    elif kind == "span":
        real = batch["attention_mask"].bool()
        fill = torch.finfo(torch.float32).min  # padding gets no probability in either distribution
        s = student_logits.float().masked_fill(~real.unsqueeze(-1), fill)
        t = teacher_logits.detach().float().masked_fill(~real.unsqueeze(-1), fill)
        # [b, s, 2] -> [b, 2, s]: a distribution over positions for the start and for the end
        kl = _kl_rows(s.transpose(1, 2), t.transpose(1, 2), temperature).mean()
    else:
        raise ValueError(f"unknown task distillation kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kl * (temperature ** 2 if t2_scaling else 1.0)


def task_distill_loss(kind: str, task_loss: torch.Tensor, student_logits: torch.Tensor,
                      teacher_logits: torch.Tensor, batch: dict, d) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``alpha_task`` x ``task_loss`` + ``alpha_kl`` x the KL term, and its report (each term unweighted).
    ``d``: the ``model.distill`` settings of a fine-tuning config. A term whose weight is 0 is not computed."""
    kl = task_kl_loss(kind, student_logits, teacher_logits, batch, d.temperature, d.kl_t2_scaling) \
        if d.alpha_kl else task_loss.new_zeros(())
    loss = d.alpha_task * task_loss + d.alpha_kl * kl
    return loss, {"task_loss": task_loss.detach().clone(), "kl_loss": kl.detach().clone()}
