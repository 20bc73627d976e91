"""Run-directory locks (issue 11, item 2): a second pretraining or fine-tuning run into a directory that a live
run holds exits 2 at once, on every rank, naming the holder's PID and host; the first run finishes untouched.

Two real concurrent jobs: the first is a forked gloo world left running, the second a 2-rank world of the
real CLI (only its rank 0 takes the lock, so rank 1 must learn the outcome from it).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from bio_megatron.utils.io import OUTPUT_MARKER
from harness import run_world, start_world
from engine.pretrain_runs import TINY, overrides, pretrain_rank
from finetune.ft_runs import RECIPES
from reliability.test_nonfinite import cli_rank

USER_FILE = "notes.txt"


def _wait_for(path: Path, world, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        assert all(p.is_alive() for p in world.procs), "the first run ended before taking its lock"
        time.sleep(0.05)


def _assert_refused(results: list, holder_pid: int, run: Path) -> None:
    assert [rc for rc, _ in results] == [2, 2]  # rank 1 fails with rank 0's error, it does not hang or run
    message = results[0][1]
    assert "run.lock" in message and str(run) in message and "in use" in message
    assert f"PID {holder_pid}" in message and socket.gethostname() in message


def test_second_pretraining_into_a_live_run_dir_exits_2(pubmed_prefix, tmp_path):
    run = tmp_path / "shared"
    steps = 30
    first = start_world(2, pretrain_rank, overrides(pubmed_prefix, tmp_path, "shared", tp=2, steps=steps, every=10,
                                                    save_last=True))
    try:
        # The marker, not run.lock: the lock exists before the holder has checked and claimed the folder, and a
        # file put there in between is (rightly) refused as a folder that is not a run of ours.
        _wait_for(run / OUTPUT_MARKER, first)
        # A user's file put into the live run's folder: kept (a folder of the user's own is refused as a run
        # folder altogether: test_run_dirs.py).
        (run / USER_FILE).write_text("the user's own file\n")
        t0 = time.time()
        second = run_world(2, cli_rank, ["pretrain", "--config", str(TINY),
                                         *overrides(pubmed_prefix, tmp_path, "shared", tp=2, steps=3)])
        assert time.time() - t0 < 30  # refused before building any model
        alive_during_second = all(p.is_alive() for p in first.procs)
        assert first.join(300) == ["finished", "finished"]
    finally:
        first.kill()
    assert alive_during_second  # the refusal happened while the holder was really running
    _assert_refused(second, first.pids()[0], run)
    # The first run's outputs are whole: one record per step, its final checkpoint, its status.
    steps_logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                    if "loss" in json.loads(line)]
    assert steps_logged == list(range(1, steps + 1))
    assert json.loads((run / "status.json").read_text()) == {"state": "finished", "step": steps}
    assert (run / "checkpoints" / "latest").read_text().strip() == str(steps)
    assert (run / USER_FILE).read_text() == "the user's own file\n"
    assert not (run / "run.lock").exists()  # released at the end


def test_second_finetuning_into_a_live_experiment_dir_exits_2(tmp_path):
    argv = ["finetune", "ner", "--config", str(RECIPES["ner"]), f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=ft", "model.dataset.test_file=null", "model.dataset.max_train_examples=64",
            "model.dataset.max_eval_examples=16"]
    first = start_world(1, cli_rank, [*argv, "trainer.max_steps=100", "trainer.val_check_interval=50"])
    run = tmp_path / "ft" / "seed42"  # the recipe's seed: one run of the sweep
    try:
        _wait_for(run / "run.lock", first)
        second = run_world(2, cli_rank, [*argv, "model.tensor_model_parallel_size=2", "trainer.max_steps=2"])
        alive_during_second = all(p.is_alive() for p in first.procs)
        assert first.join(300) == [(0, "")]
    finally:
        first.kill()
    assert alive_during_second
    _assert_refused(second, first.pids()[0], run)
    saved = json.loads((run / "results.json").read_text())
    assert saved["status"] == "finished" and saved["best_step"] in (50, 100)
    assert [h["step"] for h in saved["history"] if "loss" in h] == list(range(1, 101))  # nobody else trained here
    assert not (run / "run.lock").exists()
