"""``distill`` interrupted by SIGTERM (a scheduler's preemption) saves the step it reached, exits as interrupted, and
the same command resumes it to the uninterrupted run's losses, term by term (dropout on: the RNG state travels with
the checkpoint). One rank: the ranks' agreement on a stop is pretraining's, tested at TP2 in
tests/engine/test_resume.py; this is the only end-to-end proof for distill, so it stays in the default suite (about 12 s)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from distill_runs import distill_overrides, distill_rank
from harness import run_world, start_world

STEPS = 8
TERMS = ("loss", "mlm_loss", "kl_loss", "cos_loss")


def _records(run_dir: Path) -> dict[int, dict]:
    """step -> the step's record (a resumed run's later record for a step wins)."""
    out: dict[int, dict] = {}
    f = run_dir / "metrics.jsonl"
    for rec in map(json.loads, f.read_text().splitlines() if f.exists() else []):
        if "loss" in rec:
            out[rec["step"]] = rec
    return out


def _wait_for_steps(run_dir: Path, n: int, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while len(_records(run_dir)) < n:
        assert time.time() < deadline, f"{run_dir}: fewer than {n} steps logged in {timeout} s"
        time.sleep(0.02)


def test_resume_after_sigterm_equals_the_uninterrupted_run(pubmed_prefix, distill_teacher, tmp_path) -> None:
    def over(name: str) -> list[str]:
        return distill_overrides(pubmed_prefix, tmp_path, name, distill_teacher, tp=1, steps=STEPS,
                                 extra=("model.hidden_dropout=0.1", "model.attention_dropout=0.1"))

    assert run_world(1, distill_rank, over("uninterrupted")) == ["finished"]
    world = start_world(1, distill_rank, over("sigterm"))
    _wait_for_steps(tmp_path / "sigterm", 2)
    os.kill(world.pids()[0], signal.SIGTERM)
    assert world.join() == ["interrupted"]
    status = json.loads((tmp_path / "sigterm" / "status.json").read_text())
    assert status["state"] == "interrupted" and 2 <= status["step"] < STEPS, status
    assert (tmp_path / "sigterm" / "checkpoints" / "latest").read_text().strip() == str(status["step"])
    assert run_world(1, distill_rank, over("sigterm")) == ["finished"]
    ref, got = _records(tmp_path / "uninterrupted"), _records(tmp_path / "sigterm")
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    assert [(s, k, got[s][k], ref[s][k]) for s in ref for k in TERMS if got[s][k] != pytest.approx(ref[s][k],
                                                                                                  abs=1e-6)] == []
