"""Task-specific distillation in fine-tuning: ``finetune <task>`` with ``model.teacher.restore_from_path`` pointing
at a teacher fine-tuned on the same task (a fine-tuned checkpoint of ours, or an HF task folder that ``import``
and ``finetune`` read).

The fine-tuning loop is unchanged: :func:`with_teacher` wraps the task so that its ``loss`` becomes
``alpha_task`` x the task loss + ``alpha_kl`` x KL(teacher || student) of the temperature-softened task logits
(``training/distill_task_loss.py``) while training. The teacher runs on the same micro-batch (the same encoder
inputs, packed or not) under ``torch.no_grad``, in eval mode, outside DDP and the optimizer, at the student's
tensor-parallel layout. In evaluation (dev and test run without gradients) the loss is the task's own, so
``val_loss`` stays comparable with plain fine-tuning, and predictions, scores and checkpoints are the student's
alone: the saved model is an ordinary fine-tuned model of its task.
"""

from __future__ import annotations

import torch

from bio_megatron.loading.teacher import inspect_task_teacher, load_task_teacher
from bio_megatron.tasks.packing import model_inputs
from bio_megatron.tasks.protocol import Task
from bio_megatron.training.distill_task_loss import REPORT_KEYS, task_distill_loss
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def kind_of(task: Task) -> str:
    """What the task's logits are a distribution over (``training/distill_task_loss.KINDS``)."""
    if task.name == "ner":
        return "tokens"
    if task.name == "qa":
        return "span"
    mode = getattr(task, "mode", "single")
    if mode == "regression":
        raise BioMegatronError(f"model.teacher.restore_from_path: {task.name} {task.d.task_name} is a regression "
                               "task: its one output is a score, not a distribution to distil with a KL term; "
                               "fine-tune it without a teacher")
    return "sequence" if mode == "single" else "multilabel"


class DistilledTask:
    """The wrapped task with a training loss that adds the teacher's KL term; every other member is the task's."""

    report_keys = REPORT_KEYS  # the loop averages them per step; metrics.jsonl records them (unweighted)

    def __init__(self, task: Task, teacher: torch.nn.Module, settings, kind: str):
        self.task, self.teacher, self.settings, self.kind = task, teacher, settings, kind
        self.last_report: dict[str, torch.Tensor] = {}

    def __getattr__(self, name: str):
        return getattr(self.__dict__["task"], name)

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        task_loss = self.task.loss(logits, batch)
        if not torch.is_grad_enabled():  # dev / test evaluation: the task's own loss, comparable with plain runs
            self.last_report = {}
            return task_loss
        with torch.no_grad():
            args, kwargs = model_inputs(batch)
            teacher_logits = self.teacher(*args, **kwargs)
        loss, self.last_report = task_distill_loss(self.kind, task_loss, logits, teacher_logits, batch,
                                                   self.settings)
        return loss


def check_teacher(cfg, task: Task, tokenizer) -> None:
    """The teacher checked against the student without reading a weight (``finetune --dry-run`` and the run's own
    set-up, before any process group exists): task kind, source, task, labels, vocabulary, shape vs layout."""
    if cfg.model.teacher.restore_from_path:
        kind_of(task)
        inspect_task_teacher(cfg, task.labels, tokenizer.vocab_file)


def with_teacher(cfg, task: Task, tokenizer) -> Task:
    """``task`` itself without ``model.teacher.restore_from_path``; else the task distilling from that teacher
    (loaded now, after the student, at the run's layout; refusals are one line, exit 2,
    before the run folder is touched)."""
    m = cfg.model
    if not m.teacher.restore_from_path:
        return task
    kind = kind_of(task)
    teacher = load_task_teacher(cfg, task.labels, tokenizer.vocab_file, tokenizer.vocab_size, task.build_head,
                                cfg.trainer.seed)
    d = m.distill
    log.info("task-specific distillation: loss = %g x %s loss + %g x KL(teacher || student, T=%g%s) over the %s "
             "logits", d.alpha_task, task.name, d.alpha_kl, d.temperature, ", x T^2" if d.kl_t2_scaling else "",
             {"tokens": "per-token label", "sequence": "label", "multilabel": "per-label sigmoid",
              "span": "start and end"}[kind])
    return DistilledTask(task, teacher, d, kind)
