"""The distillation config (``bio-megatron distill``): the pretraining config of the student plus ``model.teacher.*``
(where the teacher comes from, its precision) and ``model.distill.*`` (the loss: bio-lm §7.1 after DistilBERT).

Layout: teacher and student share the run's tensor-parallel layout (``model.tensor_model_parallel_size``; the
vocabulary-parallel KL needs both vocabularies split alike) and data-parallel replicas. Pipeline parallelism is
refused here: megatron-core's schedules pass one tensor between stages, so the teacher's logits and hidden states
cannot reach the student's last stage.

Task-specific distillation (``finetune <task>`` with ``model.teacher.restore_from_path``: a teacher fine-tuned on the
same task) reads the same ``model.teacher`` block and its own ``model.distill`` block (:class:`TaskDistillSettings`);
:func:`teacher_block_problems` checks the teacher block for both commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bio_megatron.config.loader import build_config, load_document
from bio_megatron.config.pretrain import ModelConfig, PretrainConfig, validate
from bio_megatron.utils.errors import ConfigError


@dataclass
class TeacherConfig:
    restore_from_path: str | None = None
    """The teacher: our checkpoint (or run / checkpoints folder), a Hugging Face folder, a ``.nemo`` archive or a
    Megatron-LM checkpoint (anything ``bio_megatron.formats.source.resolve_source`` reads). Its shape and family come
    from it; its vocabulary must be the student's (by content)."""
    precision: Literal["32", "16", "bf16", "16-mixed", "bf16-mixed"] | int | None = None
    """The teacher's compute dtype (forward only: no gradients, no optimizer state); null: ``trainer.precision``."""


@dataclass
class DistillSettings:
    alpha_mlm: float = 5.0
    """Weight of the student's masked-LM cross entropy (bio-lm §7.1: 5.0)."""
    alpha_kl: float = 2.0
    """Weight of KL(teacher || student) on temperature-softened distributions (bio-lm §7.1: 2.0)."""
    alpha_cos: float = 1.0
    """Weight of the cosine embedding loss between the last hidden states (bio-lm §7.1: 1.0, "optionally"; 0 off)."""
    temperature: float = 2.0
    """Softens both distributions in the KL term (bio-lm §7.1: 2.0)."""
    kl_t2_scaling: bool = True
    """Multiply the KL term by T^2, as DistilBERT does (NeMo's and Megatron-LM's KL losses do not)."""
    kl_positions: Literal["all", "masked"] = "all"
    """Positions the KL covers: every non-pad token (DistilBERT's default) or the masked ones only."""


@dataclass
class TaskDistillSettings:
    """``finetune <task>``'s loss when ``model.teacher.restore_from_path`` is set (``training/distill_loss.py``):
    alpha_task x the task's own loss + alpha_kl x KL(teacher || student) of the temperature-softened task logits."""

    alpha_task: float = 1.0
    """Weight of the task loss on the gold labels (assumed: the papers we follow distil task-agnostically only)."""
    alpha_kl: float = 1.0
    """Weight of KL(teacher || student) on the task logits (start and end logits for QA; assumed, as alpha_task)."""
    temperature: float = 2.0
    """Softens both distributions in the KL term (as the MLM distillation's, bio-lm §7.1: 2.0)."""
    kl_t2_scaling: bool = True
    """Multiply the KL term by T^2, as DistilBERT does, so its gradients keep their scale as T changes."""


@dataclass
class DistillModelConfig(ModelConfig):
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillSettings = field(default_factory=DistillSettings)


@dataclass
class DistillConfig(PretrainConfig):
    model: DistillModelConfig = field(default_factory=DistillModelConfig)


def teacher_block_problems(m, command: str) -> list[str]:
    """The ``model.teacher`` block and the layout, as both commands need them: ``distill`` (``command``
    "distillation") always, ``finetune`` only when a teacher is set. Each problem quotes its values."""
    problems = []
    where = m.teacher.restore_from_path
    if where is not None and (not isinstance(where, str) or not where.strip()):
        problems.append(f"model.teacher.restore_from_path ({where!r}) must be a path: the teacher's checkpoint, "
                        "run folder, HF folder, .nemo or Megatron-LM checkpoint")
    if m.pipeline_model_parallel_size != 1:
        problems.append(f"model.pipeline_model_parallel_size ({m.pipeline_model_parallel_size}) must be 1 for "
                        f"{command}: megatron-core's schedules pass one tensor between stages, so the teacher's "
                        "outputs cannot reach the student's last stage; use tensor and data parallelism")
    return problems


def task_distill_problems(m) -> list[str]:
    """``finetune <task>``'s ``model.teacher`` / ``model.distill`` (nothing to check without a teacher)."""
    if not m.teacher.restore_from_path:
        return []
    d = m.distill
    problems = teacher_block_problems(m, "task-specific distillation")
    for key in ("alpha_task", "alpha_kl"):
        value = getattr(d, key)
        if not value >= 0.0 or value == float("inf"):
            problems.append(f"model.distill.{key} ({value}) must be a finite number >= 0")
    if d.alpha_task == d.alpha_kl == 0.0:
        problems.append("model.distill.alpha_task and alpha_kl are both 0: nothing to train")
    if not 0.0 < d.temperature < float("inf"):
        problems.append(f"model.distill.temperature ({d.temperature}) must be > 0")
    return problems


def distill_problems(m: DistillModelConfig) -> list[str]:
    """What distillation needs beyond a valid pretraining config, each quoting its values."""
    d, problems = m.distill, []
    if not m.teacher.restore_from_path:
        problems.append("model.teacher.restore_from_path is required: the teacher's checkpoint, HF folder, .nemo or "
                        "Megatron-LM checkpoint")
    problems += teacher_block_problems(m, "distillation")
    if m.sequence_parallel:
        problems.append("model.sequence_parallel (true) is not supported by distill: the cosine term compares whole "
                        "sequences of hidden states; set it to false")
    if m.objective == "electra" or m.family == "electra":
        problems.append("an ELECTRA student has no masked-LM head over its discriminator to distil into; distil a "
                        "BERT, RoBERTa or ALBERT student (fine-tune ELECTRA separately)")
    if m.bert_binary_head:
        problems.append("model.bert_binary_head (true): distillation trains the masked-LM head only; set it to false")
    for key in ("alpha_mlm", "alpha_kl", "alpha_cos"):
        value = getattr(d, key)
        if not value >= 0.0 or value == float("inf"):
            problems.append(f"model.distill.{key} ({value}) must be a finite number >= 0")
    if d.alpha_mlm == d.alpha_kl == d.alpha_cos == 0.0:
        problems.append("model.distill.alpha_mlm, alpha_kl and alpha_cos are all 0: nothing to train")
    if not 0.0 < d.temperature < float("inf"):
        problems.append(f"model.distill.temperature ({d.temperature}) must be > 0")
    return problems


def validate_distill(cfg: DistillConfig, world_size: int | None = None) -> None:
    """The pretraining checks and the distillation ones, reported together."""
    problems: list[str] = []
    try:
        validate(cfg, world_size)
    except ConfigError as exc:
        problems += exc.problems
    problems += distill_problems(cfg.model)
    if problems:
        raise ConfigError(problems)


def load_distill_config(path: str | Path | None, overrides: list[str] = (), world_size: int | None = None
                        ) -> DistillConfig:
    """Recipe + overrides -> validated ``DistillConfig`` (NeMo's pretraining key names are mapped as for pretrain)."""
    raw = load_document(path, list(overrides), "pretrain", world_size)
    return build_config(DistillConfig, raw, lambda cfg: validate_distill(cfg, world_size), str(path) if path else None)
