"""Tiny distillation runs for tests/distill: a teacher pretrained for a few steps, and what each forked rank runs."""

from __future__ import annotations

import os
from pathlib import Path

from engine.pretrain_runs import losses, overrides, pretrain_rank  # noqa: F401  (losses: re-exported)
from harness import run_world

ROOT = Path(__file__).resolve().parents[2]
TINY_DISTILL = ROOT / "nemo_configs" / "distill" / "tiny_distill.yaml"


def make_teacher(prefix: Path, root: Path, steps: int = 4) -> Path:
    """The tiny recipe pretrained ``steps`` steps (4 layers, hidden 64): its run folder is the teacher."""
    over = overrides(prefix, root, "teacher", steps=steps, save_last=True)
    assert run_world(1, pretrain_rank, over, timeout=300) == ["finished"]
    return root / "teacher"


def distill_overrides(prefix: Path, root: Path, name: str, teacher: Path, *, tp: int = 1, steps: int = 3,
                      distopt: bool = False, every: int = 0, save_last: bool = False,
                      extra: tuple[str, ...] = ()) -> list[str]:
    return overrides(prefix, root, name, tp=tp, steps=steps, distopt=distopt, every=every, save_last=save_last,
                     extra=(f"model.teacher.restore_from_path={teacher}", *extra))


def distill_rank(over: list[str], recipe: Path = TINY_DISTILL) -> str:
    """What one forked rank runs: the CLI path minus argument parsing (``recipe``: the distillation recipe)."""
    import torch.distributed as dist

    from bio_megatron.config.distill import load_distill_config
    from bio_megatron.loading.teacher import load_teacher
    from bio_megatron.training.distill import run_distillation

    cfg = load_distill_config(recipe, over, world_size=int(os.environ["WORLD_SIZE"]))
    status = run_distillation(cfg, load_teacher)
    dist.barrier()
    return status
