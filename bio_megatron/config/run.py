"""A run's config, shared by pretraining, fine-tuning and distillation: NeMo's ``trainer`` and ``exp_manager``
blocks and the run's ``name``, as typed dataclasses (field names as NeMo's), and where they place the run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bio_megatron.utils.io import system_folder


@dataclass
class TrainerConfig:
    devices: int | Literal["auto"] = "auto"
    """Processes per node; informational (the world comes from torchrun/SLURM), checked when an int."""
    num_nodes: int = 1
    precision: Literal["32", "16", "bf16", "16-mixed", "bf16-mixed"] | int = "bf16"
    """Compute dtype, honoured on CPU as on GPU: bf16/bf16-mixed (bfloat16), 16/16-mixed (float16 with dynamic
    loss scaling), 32. Half precision always keeps fp32 main parameters in megatron-core's optimizer."""
    max_steps: int = 100_000
    log_every_n_steps: int = 10
    val_check_interval: int = 1000
    """Run validation every N optimizer steps (and at the end)."""
    limit_val_batches: int = 10
    """Global batches per validation."""
    gradient_clip_val: float = 1.0
    seed: int = 1234
    max_nonfinite_steps: int = 3
    """Stop the run (exit code 3, status.json "failed") after this many steps in a row whose loss or gradients
    were NaN/Inf; each such step is skipped (no update), as Megatron-LM skips an overflowed iteration."""
    accelerator: Literal["auto", "gpu", "cpu"] = "auto"
    skip_memory_check: bool = False
    """Skip the check that refuses, before allocation, a model whose weights, gradients and optimizer state
    cannot fit in the available memory (``bio_megatron/training/memory.py``)."""


@dataclass
class CheckpointCallbackParams:
    every_n_train_steps: int = 1000
    save_last: bool = True
    """Save at the end of training."""


@dataclass
class ExpManagerConfig:
    exp_dir: str = "runs"
    name: str = "bio_megatron"
    resume_if_exists: bool = True
    """Resume from ``<exp_dir>/<name>/checkpoints/latest`` when it exists."""
    resume_from_checkpoint: str | None = None
    """Resume exactly (model, optimizer, scheduler, RNG, data position) from this checkpoint directory."""
    create_tensorboard_logger: bool = True
    create_wandb_logger: bool = False
    """NeMo's key: also log to Weights & Biases (``pip install 'bio-megatron[wandb]'``; ``WANDB_MODE=offline``
    without network). training/trackers.py."""
    wandb_logger_kwargs: dict | None = None
    """Lightning WandbLogger's arguments, as NeMo passes them (name, project, save_dir: default the run folder,
    offline, version, prefix, and wandb.init's own)."""
    create_mlflow_logger: bool = False
    """NeMo's key: also log to MLflow (``pip install 'bio-megatron[mlflow]'``)."""
    mlflow_logger_kwargs: dict | None = None
    """Lightning MLFlowLogger's arguments (experiment_name, run_name, tracking_uri: default the file store
    ``<run>/mlruns``, tags, save_dir, prefix, artifact_location, run_id)."""
    checkpoint_callback_params: CheckpointCallbackParams = field(default_factory=CheckpointCallbackParams)


@dataclass
class RunConfig:
    """NeMo's top level shared by pretraining and fine-tuning configs: the run's name, ``trainer`` and
    ``exp_manager`` blocks, and the run directory they place it in."""

    name: str = "megatron_bert"
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    exp_manager: ExpManagerConfig = field(default_factory=ExpManagerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.exp_manager.exp_dir) / self.exp_manager.name


def run_dir_problems(e: ExpManagerConfig) -> list[str]:
    """The run folder stays inside ``exp_manager.exp_dir``: ``name`` is a relative path of plain folder names
    (no ``..`` or ``.``, not absolute; fine-tuning's sweep itself adds ``/seedN``), since a name like ``../x`` or
    ``/etc`` would place the run, and its deletions of stale saves, anywhere. ``exp_dir`` itself may be any path
    of the user's (absolute is meant), but not a system folder."""
    name, problems = e.name, []
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in name or "\0" in name:
        problems.append(f"exp_manager.name ({name!r}) must stay inside exp_manager.exp_dir: folder names only, no "
                        "'..', not absolute (put the path in exp_manager.exp_dir)")
    elif isinstance(e.exp_dir, str) and e.exp_dir:
        system = system_folder(Path(os.path.realpath(Path(e.exp_dir) / name)))
        if system is not None:
            problems.append(f"exp_manager.exp_dir ({e.exp_dir}) places the run in a system folder ({system}); "
                            "choose a folder of your own")
    if not isinstance(e.exp_dir, str) or not e.exp_dir:
        problems.append(f"exp_manager.exp_dir ({e.exp_dir!r}) must be a folder path")
    return problems
