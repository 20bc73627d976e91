"""Resume invariance and resharding.

- A TP2 run with dropout on, interrupted by SIGTERM (sent to one rank only) and resumed, reproduces
  the uninterrupted run's losses; so does one SIGKILLed after a periodic save.
- A TP2 checkpoint resumes at TP1 and at PP2 with the same next losses.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from harness import run_world, start_world

from engine.pretrain_runs import losses, overrides, pretrain_rank

STEPS = 8


def _wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not reached")


def _logged_steps(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    return len([1 for line in f.read_text().splitlines() if '"loss"' in line]) if f.exists() else 0


@pytest.fixture(scope="module")
def uninterrupted(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    run_world(2, pretrain_rank, overrides(pubmed_prefix, root, "ref", tp=2, steps=STEPS, dropout=0.1, every=2))
    ref = losses(root / "ref")
    assert sorted(ref) == list(range(1, STEPS + 1))
    return root, ref


def _assert_same(got: dict, ref: dict, tol: float) -> None:
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=tol), (step, got[step], ref[step])


def test_sigterm_to_one_rank_saves_and_resumes_exactly(uninterrupted, pubmed_prefix):
    root, ref = uninterrupted
    over = overrides(pubmed_prefix, root, "sigterm", tp=2, steps=STEPS, dropout=0.1, every=0)
    world = start_world(2, pretrain_rank, over)
    _wait_for(lambda: _logged_steps(root / "sigterm") >= 2)
    os.kill(world.pids()[1], signal.SIGTERM)  # only rank 1 hears it: the ranks must agree to stop together
    assert world.join() == ["interrupted", "interrupted"]
    status = json.loads((root / "sigterm" / "status.json").read_text())
    assert status["state"] == "interrupted" and 2 <= status["step"] < STEPS
    assert (root / "sigterm" / "checkpoints" / "latest").read_text().strip() == str(status["step"])
    assert run_world(2, pretrain_rank, over) == ["finished", "finished"]
    _assert_same(losses(root / "sigterm"), ref, 1e-6)


def test_sigkill_after_periodic_save_resumes_exactly(uninterrupted, pubmed_prefix):
    root, ref = uninterrupted
    over = overrides(pubmed_prefix, root, "sigkill", tp=2, steps=STEPS, dropout=0.1, every=2)
    world = start_world(2, pretrain_rank, over)
    latest = root / "sigkill" / "checkpoints" / "latest"
    _wait_for(lambda: latest.exists())
    world.kill(signal.SIGKILL)
    for p in world.procs:
        p.join(10)
    saved = int(latest.read_text())
    assert saved < STEPS, "the run finished before it could be killed"
    assert not (root / "sigkill" / "status.json").exists()
    # A save cut short by the kill leaves only a temporary directory, never a half-written iter_*.
    for d in (root / "sigkill" / "checkpoints").glob("iter_*"):
        assert (d / "bio_megatron.json").exists()
    assert run_world(2, pretrain_rank, over) == ["finished", "finished"]
    _assert_same(losses(root / "sigkill"), ref, 1e-6)


@pytest.mark.parametrize("target", [{"tp": 1, "pp": 1}, {"tp": 1, "pp": 2}], ids=["tp1", "pp2"])
def test_tp2_checkpoint_resumes_at_another_layout(target, pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    src = root / "tp2"
    if not src.exists():
        run_world(2, pretrain_rank, overrides(pubmed_prefix, root, "tp2", tp=2, steps=4, every=2))
    ref = losses(src)
    name = f"from_tp2_{target['tp']}x{target['pp']}"
    ckpt = src / "checkpoints" / "iter_0000002"
    run_world(target["tp"] * target["pp"], pretrain_rank,
              overrides(pubmed_prefix, root, name, steps=4, **target,
                        extra=(f"exp_manager.resume_from_checkpoint={ckpt}",)))
    got = losses(root / name)
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (step, got, ref)


def test_distributed_optimizer_checkpoint_resumes_exactly(pubmed_prefix, tmp_path):
    """DP2 with the distributed optimizer (fully_reshardable sharding, torch-Adam fallback fixes)."""
    run_world(2, pretrain_rank, overrides(pubmed_prefix, tmp_path, "ref", distopt=True, steps=4, every=2))
    ref = losses(tmp_path / "ref")
    ckpt = tmp_path / "ref" / "checkpoints" / "iter_0000002"
    run_world(2, pretrain_rank, overrides(pubmed_prefix, tmp_path, "resumed", distopt=True, steps=4,
                                          extra=(f"exp_manager.resume_from_checkpoint={ckpt}",)))
    got = losses(tmp_path / "resumed")
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(ref[step], abs=1e-6), (step, got, ref)


def _rng_across_machine_kinds() -> dict:
    import random

    import torch
    from megatron.core import tensor_parallel

    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training import checkpoint

    init_distributed()
    init_model_parallel(1, 1, seed=5)
    saved = checkpoint._rng_state()
    expected = random.random()
    tracker = tensor_parallel.get_cuda_rng_tracker()
    before = {k: v.clone() for k, v in tracker.get_states().items()}
    # what a GPU run saves: a CUDA generator state, and CUDA states in megatron's tracker (16 bytes each)
    on_gpu = {**saved, "cuda": torch.zeros(16, dtype=torch.uint8),
              "tracker": {k: torch.zeros(16, dtype=torch.uint8) for k in saved["tracker"]}}
    checkpoint._set_rng_state(on_gpu)
    after = tracker.get_states()
    return {"python_restored": random.random() == expected,
            "tracker_kept": all(torch.equal(before[k], after[k]) for k in before)}


def test_rng_state_of_a_gpu_run_resumes_on_the_cpu_with_the_seeded_streams():
    """A checkpoint saved on a GPU and resumed here (or back): Python's, numpy's and torch's CPU states are restored;
    megatron's tracker keeps this run's seeding (a GPU run's CUDA generator states do not fit the CPU shim's
    generators; before, they were set into the tracker as they were), with a warning that the run is not
    bit-identical to an uninterrupted one."""
    (res,) = run_world(1, _rng_across_machine_kinds)
    assert res == {"python_restored": True, "tracker_kept": True}
