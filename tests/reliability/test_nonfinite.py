"""NaN/Inf policy (issue 11, item 3): a non-finite step is skipped on every rank alike, a run that stays
non-finite stops with exit 3 and ``status.json`` "failed", and no non-finite model becomes ``latest`` or "best".

Real tiny runs at TP2 (two forked gloo ranks). The divergence case uses a learning rate that blows the
weights up after one update; the single-bad-step case poisons one TP-sharded weight's gradient on ONE
rank (a test-side hook, the model itself is real), so only a world-wide agreement keeps the shards equal.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from harness import run_world
from engine.pretrain_runs import TINY, overrides, pretrain_rank
from finetune.ft_runs import RECIPES, ROOT

HUGE_LR = ["model.optim.lr=1e6", "model.optim.sched.name=constant", "model.optim.sched.warmup_ratio=null",
           "model.optim.sched.min_lr=0"]


def cli_rank(argv: list[str]) -> tuple[int, str]:
    """One rank of the real CLI: its exit code and the error lines it logged."""
    import os

    from bio_megatron.cli import main
    from bio_megatron.utils.log import get_logger

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    get_logger().addHandler(Keep(logging.ERROR))
    os.chdir(ROOT)  # the fine-tuning recipes name their data relative to the checkout
    return main(argv), " ".join(messages)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _checkpoint_finite(directory: Path, tmp_path: Path) -> bool:
    """Every tensor saved in a dist checkpoint is finite (read offline with torch's own converter)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{directory.name}.pt"
    dcp_to_torch_save(str(directory), str(out))
    tensors = []

    def walk(x) -> None:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)

    state = torch.load(out, weights_only=False)  # our own file, converted just above (holds non-tensor extras)
    assert "embedding.word_embeddings.weight" in state  # the model's weights are in there, not only metadata
    walk(state)
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def test_diverging_pretraining_stops_and_keeps_last_finite_checkpoint(pubmed_prefix, tmp_path):
    over = overrides(pubmed_prefix, tmp_path, "nan", tp=2, steps=8, every=1, save_last=True,
                     extra=(*HUGE_LR, "trainer.max_nonfinite_steps=2"))
    results = run_world(2, cli_rank, ["pretrain", "--config", str(TINY), *over])
    run = tmp_path / "nan"
    assert [rc for rc, _ in results] == [3, 3]  # every rank exits with the documented code
    assert "non-finite" in results[0][1] and "2 steps in a row" in results[0][1] and "latest" in results[0][1]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "non-finite" in status["reason"] and status["step"] < 8
    # Step 1 updated from finite gradients; the blown-up weights then give NaN: steps 2 and 3 are skipped.
    recs = [r for r in _records(run) if "loss" in r]
    assert [r["nonfinite"] for r in recs] == [False, True, True]
    assert recs[-1]["skipped_steps"] == 2 and recs[-1]["loss"] is None
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "1"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_0000001", "latest"]  # no NaN save, no temp dir
    assert _checkpoint_finite(ckpts / "iter_0000001", tmp_path)
    assert not (run / "run.lock").exists()  # released on the error path


def poisoned_rank(over: list[str], step: int, rank: int) -> tuple[str, list[tuple]]:
    """Train with NaN written into one TP-sharded weight's gradient on ``rank`` at ``step`` only; record per
    step whether the update was skipped, whether this rank's weights changed, and the scheduler's advance."""
    import torch
    import torch.distributed as dist

    from bio_megatron.training import loop

    real, seen = loop.train_step, []

    def wrapped(s):
        before = [p.detach().clone() for p in s.model.parameters()]
        sched = s.scheduler.num_steps
        hook = None
        if s.step + 1 == step and dist.get_rank() == rank:
            # A TP-sharded bias: its gradient reaches DDP's buffer through autograd, where a hook can poison it
            # (fused weight gradients are written into the buffer by the GEMM and never pass a tensor hook).
            param = next(p for p in s.model.parameters() if getattr(p, "tensor_model_parallel", False) and p.dim() == 1)
            hook = param.register_hook(lambda g: torch.full_like(g, math.nan))
        try:
            r = real(s)
        finally:
            if hook is not None:
                hook.remove()
        changed = any(not torch.equal(a, b) for a, b in zip(before, s.model.parameters()))
        seen.append((s.step + 1, r.nonfinite, changed, s.scheduler.num_steps - sched))
        return r

    loop.train_step = wrapped
    return pretrain_rank(over), seen


def test_single_nonfinite_step_is_skipped_on_every_rank(pubmed_prefix, tmp_path):
    over = overrides(pubmed_prefix, tmp_path, "poison", tp=2, steps=4, every=1, save_last=True)
    results = run_world(2, poisoned_rank, over, 2, 1)
    for status, seen in results:
        assert status == "finished"
        # Step 2: rank 1 alone saw NaN, yet BOTH ranks skipped: weights and LR schedule untouched.
        assert seen == [(1, False, True, 1), (2, True, False, 0), (3, False, True, 1), (4, False, True, 1)]
    run = tmp_path / "poison"
    recs = {r["step"]: r for r in _records(run) if "loss" in r}
    assert recs[2]["nonfinite"] and recs[2]["skipped_steps"] == 1 and math.isfinite(recs[2]["loss"])
    assert not recs[3]["nonfinite"] and recs[4]["skipped_steps"] == 1
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    # The save at the skipped step is left out; training then saves normally again.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_0000001", "iter_0000003", "iter_0000004", "latest"]


def test_diverging_finetuning_writes_no_results(tmp_path):
    argv = ["finetune", "ner", "--config", str(RECIPES["ner"]), f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=nan", "model.tensor_model_parallel_size=2", "trainer.max_steps=6",
            "trainer.val_check_interval=1", "trainer.max_nonfinite_steps=2", "model.dataset.test_file=null",
            "model.dataset.max_train_examples=64", "model.dataset.max_eval_examples=16", *HUGE_LR]
    results = run_world(2, cli_rank, argv)
    assert [rc for rc, _ in results] == [3, 3]
    assert "fine-tuning stopped" in results[0][1] and "no results.json" in results[0][1]
    run = tmp_path / "nan" / "seed42"
    assert not (run / "results.json").exists() and not (tmp_path / "nan" / "results.json").exists()
    # Only the finite step-1 model was ever evaluated and kept as best; no NaN model was selected.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_0000001", "latest"]
    assert _checkpoint_finite(run / "checkpoints" / "iter_0000001", tmp_path)
