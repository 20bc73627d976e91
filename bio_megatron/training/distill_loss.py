"""Knowledge distillation's loss terms on vocabulary-parallel logits (bio-lm §7, after DistilBERT, Sanh et al. 2019).

loss = ``alpha_mlm`` x masked-LM cross entropy (mean over the masked positions)
     + ``alpha_kl`` x KL(teacher || student) of the temperature-softened distributions (mean over the positions
       ``kl_positions`` selects: every non-pad token, as DistilBERT, or the masked ones only), times T^2 when
       ``kl_t2_scaling`` (DistilBERT scales so; NeMo's and Megatron-LM's KL losses do not)
     + ``alpha_cos`` x cosine embedding loss, 1 - cos(student, teacher), between the last hidden states (mean over
       the non-pad tokens; the student's through a learned projection when the widths differ).

The logits are each rank's slice of the vocabulary (``[..., V/TP]``), as megatron-core's output layer leaves them.
As megatron-core's vocab-parallel cross entropy (``tensor_parallel/cross_entropy.py``) the softmax normaliser is
assembled from a max and a sum all-reduced over the tensor-parallel group: the full vocabulary is never gathered
on one rank. Unlike megatron's function, nothing here writes into the logits (the KL and the cross entropy read
the same student logits). The vocabulary padding (ids >= the real vocabulary, a multiple of 128 x TP) is cut off
before anything is computed, so no term depends on the TP size or on padded entries.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

# Per-micro-batch values the loop averages like the loss; each term is logged separately (metrics.jsonl, TB).
REPORT_KEYS = ("mlm_loss", "kl_loss", "cos_loss")


def real_vocab(logits: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, int]:
    """This rank's slice of the logits without the vocabulary padding, and the id its first column stands for."""
    per_rank = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * per_rank
    return logits[..., :max(0, min(per_rank, vocab_size - start))], start


def _tp_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the TP group of a value every rank then uses identically (the per-token loss): the backward hands
    each rank the gradient of the replicated loss unchanged, which is the gradient of its own share."""
    return reduce_from_tensor_model_parallel_region(x) if ps.get_tensor_model_parallel_world_size() > 1 else x


class _SumShared(torch.autograd.Function):
    """Sum over the TP group of a value each rank then uses on its own vocabulary slice (the softmax normaliser):
    its gradient is the sum of every rank's, so the backward all-reduces too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=ps.get_tensor_model_parallel_group())
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=ps.get_tensor_model_parallel_group())
        return grad


def _tp_sum_shared(x: torch.Tensor) -> torch.Tensor:
    return _SumShared.apply(x) if ps.get_tensor_model_parallel_world_size() > 1 else x


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of this rank's vocabulary slice (float32) under the softmax over the whole vocabulary."""
    x = logits.float()
    local_max = x.amax(dim=-1) if x.shape[-1] else torch.full(x.shape[:-1], float("-inf"), device=x.device)
    shift = local_max.detach().clone()
    if ps.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    shifted = x - shift.unsqueeze(-1)  # a constant per row: the log-softmax does not depend on it
    return shifted - torch.log(_tp_sum_shared(shifted.exp().sum(dim=-1))).unsqueeze(-1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.float()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, positions: torch.Tensor,
            vocab_size: int, temperature: float, t2_scaling: bool) -> torch.Tensor:
    """Mean over ``positions`` [b, s] of KL(softmax(teacher / T) || softmax(student / T)), x T^2 if ``t2_scaling``.
    Logits: [b, s, V/TP] vocabulary slices (the teacher's carry no gradient)."""
    s, _ = real_vocab(student_logits, vocab_size)
    t, _ = real_vocab(teacher_logits.detach(), vocab_size)
    log_q = log_softmax(s.float() / temperature)
    log_p = log_softmax(t.float() / temperature)
    per_token = _tp_sum((log_p.exp() * (log_p - log_q)).sum(dim=-1))
    return _masked_mean(per_token, positions) * (temperature ** 2 if t2_scaling else 1.0)


def mlm_loss(student_logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
             vocab_size: int) -> torch.Tensor:
    """Masked-LM cross entropy, mean over the masked positions (``loss_mask`` [b, s]); ``labels`` [b, s] ids."""
    s, start = real_vocab(student_logits, vocab_size)
    log_q = log_softmax(s)
    local = labels - start
    here = (local >= 0) & (local < s.shape[-1])
    picked = log_q.gather(-1, local.clamp(0, max(s.shape[-1] - 1, 0)).unsqueeze(-1)).squeeze(-1) if s.shape[-1] \
        else torch.zeros_like(labels, dtype=log_q.dtype)
    target = _tp_sum(torch.where(here, picked, torch.zeros_like(picked)))  # each id lives on one rank
    return _masked_mean(-target, loss_mask)


def cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, positions: torch.Tensor,
                projection: torch.nn.Module | None = None) -> torch.Tensor:
    """Mean over ``positions`` [b, s] of 1 - cos(student, teacher) between hidden states [b, s, h_*]; the student's
    pass through ``projection`` (h_student -> h_teacher) first when given."""
    s = student_hidden.float()
    if projection is not None:
        s = projection(s.to(projection.weight.dtype)).float()
    cos = torch.nn.functional.cosine_similarity(s, teacher_hidden.detach().float(), dim=-1, eps=1e-8)
    return _masked_mean(1.0 - cos, positions)


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, student_hidden: torch.Tensor,
                 teacher_hidden: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
                 padding_mask: torch.Tensor, vocab_size: int, d, projection: torch.nn.Module | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's combined loss and its report (``loss`` plus :data:`REPORT_KEYS`). ``d``: the
    ``model.distill`` settings (alpha_mlm, alpha_kl, alpha_cos, temperature, kl_t2_scaling, kl_positions).
    A term whose weight is 0 is not computed (its report is 0)."""
    zero = student_logits.new_zeros((), dtype=torch.float32)
    real = padding_mask.bool()
    mlm = mlm_loss(student_logits, labels, loss_mask, vocab_size) if d.alpha_mlm else zero
    positions = loss_mask.bool() & real if d.kl_positions == "masked" else real
    kl = kl_loss(student_logits, teacher_logits, positions, vocab_size, d.temperature, d.kl_t2_scaling) \
        if d.alpha_kl else zero
    cos = cosine_loss(student_hidden, teacher_hidden, real, projection) if d.alpha_cos else zero
    loss = d.alpha_mlm * mlm + d.alpha_kl * kl + d.alpha_cos * cos
    report = {"loss": loss.detach().clone(), "mlm_loss": mlm.detach().clone(), "kl_loss": kl.detach().clone(),
              "cos_loss": cos.detach().clone()}
    return loss, report


def step_metrics(reduced: dict[str, float]) -> dict[str, float]:
    """The step record's distillation figures: each unweighted term."""
    return {k: reduced[k] for k in REPORT_KEYS if k in reduced}
