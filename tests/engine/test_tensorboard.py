"""TensorBoard event files under NeMo's scalar names, in pretraining and in fine-tuning, read back with
tensorboard's own ``EventAccumulator`` (not with our writer)."""

from __future__ import annotations

import math
from pathlib import Path

from harness import run_world
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from engine.pretrain_runs import overrides, pretrain_rank

NEMO_TRAIN = {"reduced_train_loss", "lr", "global_step", "consumed_samples"}


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_pretraining_writes_nemo_tags(tmp_path, pubmed_prefix):
    over = overrides(pubmed_prefix, tmp_path, "tb", steps=3, extra=(
        "exp_manager.create_tensorboard_logger=true", "trainer.val_check_interval=2"))
    run_world(1, pretrain_rank, over)
    tb = _scalars(tmp_path / "tb" / "tensorboard")
    assert NEMO_TRAIN | {"val_loss", "grad_norm"} <= set(tb), sorted(tb)
    assert not any(t.startswith(("train/", "validation/")) for t in tb)  # the former names are gone
    assert [s for s, _ in tb["reduced_train_loss"]] == [1, 2, 3]
    assert [v for _, v in tb["global_step"]] == [1.0, 2.0, 3.0]
    assert [v for _, v in tb["consumed_samples"]] == [8.0, 16.0, 24.0]  # global batch 8
    assert all(math.isfinite(v) and v > 0 for _, v in tb["reduced_train_loss"] + tb["val_loss"])


def test_finetuning_writes_nemo_tags(tmp_path):
    from finetune.ft_runs import finetune_rank

    over = ["trainer.max_steps=2", "trainer.val_check_interval=1", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", "model.micro_batch_size=4", "model.global_batch_size=8",
            "exp_manager.create_tensorboard_logger=true", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ner"]
    res = run_world(1, finetune_rank, "ner", over)[0]
    tb = _scalars(tmp_path / "ner" / "tensorboard")
    assert NEMO_TRAIN | {"val_loss", "val_f1"} <= set(tb), sorted(tb)
    assert [s for s, _ in tb["reduced_train_loss"]] == [1, 2]
    assert all(abs(v - x) < 1e-6 for (_, v), x in zip(tb["reduced_train_loss"], res["losses"]))
    assert [v for _, v in tb["consumed_samples"]] == [8.0, 16.0]
    assert [s for s, _ in tb["val_f1"]] == [1, 2] and all(0.0 <= v <= 1.0 for _, v in tb["val_f1"])
    assert all(math.isfinite(v) and v > 0 for _, v in tb["val_loss"])
    off = run_world(1, finetune_rank, "ner", over[:-3] + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=no_tb",
                                                          "exp_manager.create_tensorboard_logger=false"])
    assert off and not (tmp_path / "no_tb" / "tensorboard").exists()
