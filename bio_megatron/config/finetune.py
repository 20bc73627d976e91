"""Fine-tuning configs (NER, RE, QA, BLURB classify) with NeMo's key names, on top of the pretraining dataclasses.

The encoder block reuses :class:`ModelConfig` (size, TP/PP, dropout, tokenizer, optim, ``restore_from_path``);
each task adds NeMo's ``model.dataset`` keys and its head (``model.head`` for token classification and QA,
``model.classifier_head`` for RE and classify). ``model.fc_hidden_size`` is the paper's MLP width (NeMo's was always
the encoder width: ``null``). ``grid`` lists values that ``--grid`` sweeps and selects on dev.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bio_megatron.config.distill import TaskDistillSettings, TeacherConfig, task_distill_problems
from bio_megatron.config.finetune_data import (ClassifierHeadConfig, ClassifyDatasetConfig, HeadConfig,
                                               NerDatasetConfig, QaDatasetConfig, ReDatasetConfig)
from bio_megatron.config.loader import build_config, load_document
from bio_megatron.config.packing import finetune_packing_problems
from bio_megatron.config.pretrain import ModelConfig, OptimConfig, SchedConfig, encoder_problems
from bio_megatron.config.run import ExpManagerConfig, RunConfig, TrainerConfig, run_dir_problems
from bio_megatron.utils.errors import ConfigError

TASKS = ("ner", "re", "qa", "classify")
FOLD_NAMES = {str(i) for i in range(1, 11)}  # BioBERT's fold folders (model.dataset.fold)


@dataclass
class FinetuneTrainerConfig(TrainerConfig):
    max_epochs: int = 30
    max_steps: int = -1
    """-1: max_epochs x steps per epoch."""
    val_check_interval: int | float = 0
    """Evaluate on dev every N optimizer steps (an int; 0 = at the end of every epoch), or, as a float in
    (0, 1] (NeMo/Lightning), every that fraction of an epoch: 1.0 = every epoch, 0.25 = four times."""

    def val_every(self, steps_per_epoch: int) -> int:
        """Optimizer steps between dev evaluations (Lightning: int(batches per epoch x fraction), at least 1)."""
        v = self.val_check_interval
        if isinstance(v, float):
            return max(1, int(steps_per_epoch * v))
        return v or steps_per_epoch
    precision: Literal["32", "16", "bf16", "16-mixed", "bf16-mixed"] | int = 32


@dataclass
class EarlyStoppingParams:
    """NeMo's ``exp_manager.early_stopping_callback_params`` (Lightning's EarlyStopping; NeMo's defaults);
    tasks/early_stopping.py."""

    monitor: str = "val_loss"
    """``val_loss`` or ``val_<metric>`` of the task (``val_f1``, ``val_score``, ...; ``dev_<metric>`` too)."""
    mode: Literal["min", "max"] = "min"
    min_delta: float = 0.001
    patience: int = 10
    """Dev evaluations in a row without improvement before the run ends (>= 1)."""
    verbose: bool = True
    """Accepted (NeMo's key): the stop is always logged."""
    strict: bool = True
    """Accepted (NeMo's key): a monitor the task does not log is always an error."""
    check_finite: bool = True
    """Accepted (NeMo's key): a NaN value never counts as an improvement."""


@dataclass
class FinetuneExpManagerConfig(ExpManagerConfig):
    resume_if_exists: bool = True
    """Continue a preempted run from ``<run>/resume/latest`` (written on SIGTERM/SIGUSR1; removed when the run
    finishes); a finished seed of a sweep is not run again."""
    create_early_stopping_callback: bool = False
    """NeMo's key: stop after ``early_stopping_callback_params.patience`` dev evaluations without improvement."""
    early_stopping_callback_params: EarlyStoppingParams = field(default_factory=EarlyStoppingParams)


@dataclass
class FinetuneOptimConfig(OptimConfig):
    layerwise_lr_decay: float | None = None
    """ELECTRA's layer-wise learning-rate decay (BioELECTRA: 0.8, paper 002 Table 7): the head keeps ``lr``, global
    transformer layer l (0-based) gets ``lr * decay ** (L + 1 - l)``, the embeddings ``lr * decay ** (L + 2)``
    (ELECTRA's convention, training/optimizer.py ``layer_depths``); null or 1.0: one learning rate. Refused for
    the families in ``SHARED_LAYER_FAMILIES``."""


SHARED_LAYER_FAMILIES = ("albert",)
"""Families whose encoder applies one layer's weights at every depth 1..L: ELECTRA's rate per depth has no single
value for that layer (depth 1's, which it got before, all but froze it), so layer-wise decay is refused for them
rather than given a rule no paper used."""


def _finetune_optim() -> OptimConfig:
    return FinetuneOptimConfig(name="adam", lr=5e-5, weight_decay=0.0,
                               sched=SchedConfig(name="linear", warmup_ratio=0.1))


@dataclass
class FinetuneModelConfig(ModelConfig):
    size: str = "345m"
    micro_batch_size: int = 32
    global_batch_size: int = 32
    fc_hidden_size: int | None = None
    """Width of the head's hidden layers (the paper swept 512 and 1024); null = encoder width (NeMo)."""
    optim: FinetuneOptimConfig = field(default_factory=_finetune_optim)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """Task-specific distillation: a teacher fine-tuned on the same task (``config/distill.py``); null: none."""
    distill: TaskDistillSettings = field(default_factory=TaskDistillSettings)


@dataclass
class NerModelConfig(FinetuneModelConfig):
    dataset: NerDatasetConfig = field(default_factory=NerDatasetConfig)
    head: HeadConfig = field(default_factory=HeadConfig)


@dataclass
class ReModelConfig(FinetuneModelConfig):
    dataset: ReDatasetConfig = field(default_factory=ReDatasetConfig)
    classifier_head: ClassifierHeadConfig = field(default_factory=ClassifierHeadConfig)


@dataclass
class QaModelConfig(FinetuneModelConfig):
    dataset: QaDatasetConfig = field(default_factory=QaDatasetConfig)
    head: HeadConfig = field(default_factory=lambda: HeadConfig(num_fc_layers=1, fc_dropout=0.1))


@dataclass
class ClassifyModelConfig(FinetuneModelConfig):
    dataset: ClassifyDatasetConfig = field(default_factory=ClassifyDatasetConfig)
    classifier_head: ClassifierHeadConfig = field(default_factory=ClassifierHeadConfig)


@dataclass
class GridConfig:
    num_fc_layers: list[int] = field(default_factory=lambda: [1, 2])
    fc_hidden_size: list[int] = field(default_factory=lambda: [512, 1024])


@dataclass
class _FinetuneBase(RunConfig):
    name: str = "finetune"
    trainer: FinetuneTrainerConfig = field(default_factory=FinetuneTrainerConfig)
    exp_manager: FinetuneExpManagerConfig = field(default_factory=FinetuneExpManagerConfig)
    task: Literal["ner", "re", "qa"] = "ner"
    grid: GridConfig = field(default_factory=GridConfig)


@dataclass
class NerConfig(_FinetuneBase):
    model: NerModelConfig = field(default_factory=NerModelConfig)


@dataclass
class ReConfig(_FinetuneBase):
    task: Literal["ner", "re", "qa"] = "re"
    model: ReModelConfig = field(default_factory=ReModelConfig)


@dataclass
class QaConfig(_FinetuneBase):
    task: Literal["ner", "re", "qa"] = "qa"
    model: QaModelConfig = field(default_factory=QaModelConfig)


@dataclass
class ClassifyConfig(_FinetuneBase):
    task: Literal["ner", "re", "qa", "classify"] = "classify"
    model: ClassifyModelConfig = field(default_factory=ClassifyModelConfig)


CONFIG_CLASSES = {"ner": NerConfig, "re": ReConfig, "qa": QaConfig, "classify": ClassifyConfig}
FinetuneConfig = NerConfig | ReConfig | QaConfig | ClassifyConfig


def validate(cfg: FinetuneConfig, world_size: int | None = None) -> None:
    """Encoder/layout checks of the pretraining config plus the task's own, all reported together."""
    # trainer.max_steps may be -1 here (derived from max_epochs), so only the encoder's checks are shared.
    problems = encoder_problems(cfg.model, cfg.trainer, world_size) + run_dir_problems(cfg.exp_manager)
    problems += _trainer_problems(cfg) + _data_problems(cfg) + _stopping_problems(cfg) + _model_problems(cfg)
    if cfg.task == "qa":
        problems += _qa_problems(cfg.model.dataset)
    if cfg.task == "classify":
        problems += _classify_problems(cfg.model.dataset)
    if problems:
        raise ConfigError(problems)


def _trainer_problems(cfg: FinetuneConfig) -> list[str]:
    """trainer.max_steps and val_check_interval."""
    problems: list[str] = []
    if cfg.trainer.max_steps < 1 and cfg.trainer.max_steps != -1:
        problems.append(f"trainer.max_steps ({cfg.trainer.max_steps}) must be >= 1 (or -1: from max_epochs)")
    vci = cfg.trainer.val_check_interval
    if isinstance(vci, float) and not 0.0 < vci <= 1.0:  # (NaN fails this too)
        problems.append(f"trainer.val_check_interval ({vci}) as a fraction of an epoch must be in (0, 1]; "
                        "an int counts steps")
    elif not isinstance(vci, float) and vci < 0:
        problems.append(f"trainer.val_check_interval ({vci}) must be >= 0 (0: at the end of every epoch)")
    return problems


def _data_problems(cfg: FinetuneConfig) -> list[str]:
    """The examples, their packing and length, the weights a recipe starts from."""
    m, d = cfg.model, cfg.model.dataset
    problems: list[str] = []
    for key in ("max_train_examples", "max_eval_examples"):
        if getattr(d, key) is not None and getattr(d, key) < 1:
            problems.append(f"model.dataset.{key} ({getattr(d, key)}) must be >= 1 or null")
    problems += finetune_packing_problems(m, getattr(d, "packing", False))
    problems += task_distill_problems(m)
    if d.max_seq_length > m.max_position_embeddings:
        problems.append(f"model.dataset.max_seq_length ({d.max_seq_length}) exceeds model.max_position_embeddings "
                        f"({m.max_position_embeddings})")
    if m.require_restore_from_path and not m.restore_from_path:
        problems.append(f"model.restore_from_path is required by this recipe: {m.require_restore_from_path}")
    if cfg.exp_manager.resume_from_checkpoint:
        problems.append(f"exp_manager.resume_from_checkpoint ({cfg.exp_manager.resume_from_checkpoint}) is not "
                        "supported for fine-tuning; start from weights with model.restore_from_path")
    return problems


def _stopping_problems(cfg: FinetuneConfig) -> list[str]:
    """When training ends: epochs and early stopping."""
    problems: list[str] = []
    if cfg.trainer.max_steps < 0 and cfg.trainer.max_epochs < 1:
        problems.append(f"trainer.max_epochs ({cfg.trainer.max_epochs}) must be >= 1 when trainer.max_steps is -1")
    es = cfg.exp_manager.early_stopping_callback_params
    if es.patience < 1:
        problems.append(f"exp_manager.early_stopping_callback_params.patience ({es.patience}) must be >= 1")
    if not es.min_delta >= 0.0 or math.isinf(es.min_delta):  # (NaN fails this too)
        problems.append(f"exp_manager.early_stopping_callback_params.min_delta ({es.min_delta}) must be finite "
                        "and >= 0")
    return problems


def _model_problems(cfg: FinetuneConfig) -> list[str]:
    """Layer-wise learning-rate decay and the task head."""
    m = cfg.model
    problems: list[str] = []
    lwd = m.optim.layerwise_lr_decay
    if lwd is not None and not 0.0 < lwd <= 1.0:  # (NaN fails this too)
        problems.append(f"model.optim.layerwise_lr_decay ({lwd}) must be in (0, 1] or null")
    elif lwd is not None and m.family in SHARED_LAYER_FAMILIES:
        problems.append(f"model.optim.layerwise_lr_decay ({lwd}) is undefined for model.family {m.family}: its one "
                        f"shared layer runs at every depth 1..{m.shape().num_layers}, so no depth gives it a rate; "
                        "set it null")
    if m.fc_hidden_size is not None and m.fc_hidden_size < 1:
        problems.append(f"model.fc_hidden_size ({m.fc_hidden_size}) must be >= 1 or null")
    head = getattr(m, "head", None)
    layers = head.num_fc_layers if head is not None else m.classifier_head.num_output_layers
    key = "model.head.num_fc_layers" if head is not None else "model.classifier_head.num_output_layers"
    if layers < 1:
        problems.append(f"{key} ({layers}) must be >= 1 (it counts the output layer)")
    dropout = head.fc_dropout if head is not None else m.classifier_head.fc_dropout
    if not 0.0 <= dropout < 1.0:  # (NaN fails this too)
        problems.append(f"head fc_dropout ({dropout}) must be in [0, 1)")
    pooling = getattr(getattr(m, "classifier_head", None), "pooling", "cls")
    if pooling != "cls" and m.family not in (None, "modernbert"):  # the other families' heads read [CLS] only
        problems.append(f"model.classifier_head.pooling ({pooling}) is for model.family modernbert only (its HF "
                        f"classes' classifier_pooling), not {m.family}")
    return problems


def _qa_problems(d: QaDatasetConfig) -> list[str]:
    """Extractive QA's dev hold-out, windows and answer search."""
    problems: list[str] = []
    if d.dev_holdout_fraction is not None:
        if not 0.0 < d.dev_holdout_fraction < 1.0:  # (NaN fails this too)
            problems.append(f"model.dataset.dev_holdout_fraction ({d.dev_holdout_fraction}) must be in (0, 1)")
        if d.dev_file:
            problems.append(f"model.dataset.dev_holdout_fraction ({d.dev_holdout_fraction}) carves dev from "
                            f"train_file: set model.dataset.dev_file=null (it is {d.dev_file})")
    if not math.isfinite(d.null_score_diff_threshold):
        problems.append(f"model.dataset.null_score_diff_threshold ({d.null_score_diff_threshold}) must be finite")
    if d.doc_stride < 1 or d.max_query_length < 1 or d.max_answer_length < 1 or d.n_best_size < 1:
        problems.append(f"model.dataset.doc_stride ({d.doc_stride}), max_query_length ({d.max_query_length}), "
                        f"max_answer_length ({d.max_answer_length}) and n_best_size ({d.n_best_size}) must be >= 1")
    if d.max_query_length + 3 >= d.max_seq_length:
        problems.append(f"model.dataset.max_query_length ({d.max_query_length}) leaves no room for context in "
                        f"max_seq_length ({d.max_seq_length})")
    return problems


def _classify_problems(d: ClassifyDatasetConfig) -> list[str]:
    """The classification dataset's own settings."""
    problems: list[str] = []
    if d.class_balancing and d.task_name in ("biosses", "clinicalsts"):
        problems.append(f"model.dataset.class_balancing ({d.class_balancing}) weights classes or labels; "
                        f"{d.task_name} is regression: null")
    if d.pubmedqa_long_answer and d.task_name != "pubmedqa":
        problems.append(f"model.dataset.pubmedqa_long_answer (true) is PubMedQA's reasoning-free input; "
                        f"task_name is {d.task_name}: false")
    if d.fold is not None and (d.task_name not in ("gad", "euadr") or not 1 <= d.fold <= 10):
        problems.append(f"model.dataset.fold ({d.fold}) is one of BioBERT's ten folds 1..10 of gad or euadr "
                        f"(task_name is {d.task_name})")
    if d.task_name == "euadr" and d.fold is None:
        problems.append("model.dataset.task_name euadr exists only as BioBERT's ten folds: set model.dataset.fold "
                        "(1..10)")
    if d.max_seq_length < 8:  # room for the special tokens of a pair and some text
        problems.append(f"model.dataset.max_seq_length ({d.max_seq_length}) must be >= 8")
    return problems


def load_finetune_config(task: str, path: str | Path | None, overrides: list[str] = (),
                         world_size: int | None = None) -> FinetuneConfig:
    """Recipe + ``key=value`` overrides -> validated task config (every problem reported at once)."""
    if task not in CONFIG_CLASSES:
        raise ConfigError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    # classify reads NeMo's text_classification keys as RE does, less model.dataset.format (it has none)
    raw = load_document(path, list(overrides), task, world_size)
    if raw.get("task", task) != task:
        raise ConfigError(f"recipe {path} is for task {raw['task']!r}, not {task!r}")

    def prepare(cfg: FinetuneConfig) -> None:
        # The encoder's sequence length is the task's max_seq_length (batches are padded to at most that).
        cfg.model.encoder_seq_length = cfg.model.dataset.max_seq_length
        d = cfg.model.dataset
        if getattr(d, "fold", None) in range(1, 11):  # BioBERT's folds: each split file inside <data_dir>/<fold>/
            for key in ("train_file", "dev_file", "test_file"):
                if getattr(d, key):  # a resolved config's "<other fold>/<file>" moves to this fold
                    head, _, rest = getattr(d, key).partition("/")
                    setattr(d, key, f"{d.fold}/{rest if rest and head in FOLD_NAMES else getattr(d, key)}")

    return build_config(CONFIG_CLASSES[task], raw, lambda cfg: validate(cfg, world_size),
                        str(path) if path else None, prepare)
