"""Tiny pretraining runs for the engine tests: a config builder and the function each forked rank runs."""

from __future__ import annotations

import json
from pathlib import Path

TINY = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny.yaml"


def overrides(prefix: Path, run_root: Path, name: str, *, tp: int = 1, pp: int = 1, steps: int = 3,
              distopt: bool = False, dropout: float = 0.0, every: int = 0, save_last: bool = False,
              extra: tuple[str, ...] = ()) -> list[str]:
    return [
        f"model.data.data_prefix=[{prefix}]", f"exp_manager.exp_dir={run_root}", f"exp_manager.name={name}",
        f"model.tensor_model_parallel_size={tp}", f"model.pipeline_model_parallel_size={pp}",
        f"model.use_distributed_optimizer={str(distopt).lower()}", f"trainer.max_steps={steps}",
        "trainer.log_every_n_steps=1", "trainer.val_check_interval=1000", "trainer.limit_val_batches=1",
        "model.encoder_seq_length=32", "model.max_position_embeddings=64", "model.micro_batch_size=2",
        "model.global_batch_size=8", f"model.hidden_dropout={dropout}", f"model.attention_dropout={dropout}",
        "exp_manager.create_tensorboard_logger=false",
        f"exp_manager.checkpoint_callback_params.every_n_train_steps={every}",
        f"exp_manager.checkpoint_callback_params.save_last={str(save_last).lower()}",
        f"model.data.index_mapping_dir={run_root / 'index_cache'}",
        *extra,
    ]


def pretrain_rank(over: list[str]) -> str:
    """What one forked rank runs: the real CLI path minus argument parsing."""
    import torch.distributed as dist

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    cfg = load_pretrain_config(TINY, over, world_size=int(__import__("os").environ["WORLD_SIZE"]))
    status = run_pretraining(cfg)
    dist.barrier()
    return status


def losses(run_dir: Path) -> dict[int, float]:
    """step -> training loss from metrics.jsonl (a resumed run's later record for a step wins)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out
