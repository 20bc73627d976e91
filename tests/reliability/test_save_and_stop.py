"""How a pretraining run stops: a full disk during a checkpoint save, and Ctrl-C.

- Disk full: the run's folder on a small tmpfs holds the step-2 checkpoint but not the step-4 one. The real CLI
  exits 2 with one line "no space left on <checkpoints>", ``latest`` still names iteration 2, which verifies,
  and no half-written checkpoint is left (no ``iter_0000004``, no temporary directory).
- Ctrl-C: SIGINT to every rank of a 2-rank world (as a terminal sends it to its foreground group) saves and
  stops as SIGTERM does (``status.json`` "interrupted", the checkpoint of that step) and exits 130; the
  launcher's echo of the same SIGINT is ignored, a second Ctrl-C later aborts at once. The same under a real
  ``torchrun`` (whose own exit code is 1: it reports the SIGINT it received with a traceback of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import start_world

from engine.pretrain_runs import TINY, overrides
from engine.test_resume import _logged_steps, _wait_for
from reliability.test_checkpoint_integrity import _log_to, run_cli


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    # 40 MiB: the tiny model's checkpoint with its Adam state is ~27 MB, so the second one cannot fit.
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode}): needs root / CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("tp", [1, 2], ids=["1rank", "tp2"])
def test_disk_full_during_save_is_one_line_and_keeps_latest(tp, small_disk, pubmed_prefix, tmp_path):
    from bio_megatron.training.integrity import verify_checkpoint

    over = overrides(pubmed_prefix, small_disk, "run", tp=tp, steps=4, every=2, save_last=True,
                     extra=(f"model.data.index_mapping_dir={tmp_path / 'index_cache'}",))
    argv = ["pretrain", "--config", str(TINY), *over]
    if tp == 1:
        rc, log = run_cli(argv, tmp_path / "cli.log")
        codes, logs = [rc], [log]
    else:  # every rank stops with the same line (none is left waiting for the others)
        codes = start_world(tp, _cli_rank_logged, argv, str(tmp_path)).join(timeout=120)
        logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(tp)]
    ckpts = small_disk / "run" / "checkpoints"
    assert codes == [2] * tp, logs[0][-3000:]
    for log in logs:
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
        assert f"no space left on {ckpts}" in errors[0] and "iteration 2" in errors[0], errors[0]
    assert (ckpts / "latest").read_text().strip() == "2"
    verify_checkpoint(ckpts / "iter_0000002")
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_0000002", "latest"]


def _cli_rank_logged(argv: list[str], log_dir: str) -> int:
    """The real CLI in a forked rank, each rank's log in its own file."""
    from bio_megatron.cli import main

    _log_to(str(Path(log_dir) / f"rank{os.environ['RANK']}.log"))
    return main(argv)


def test_ctrl_c_saves_and_stops_like_sigterm_on_every_rank(pubmed_prefix, tmp_path):
    over = overrides(pubmed_prefix, tmp_path, "run", tp=2, steps=200, every=0)
    world = start_world(2, _cli_rank_logged, ["pretrain", "--config", str(TINY), *over], str(tmp_path))
    _wait_for(lambda: _logged_steps(tmp_path / "run") >= 2)
    world.kill(signal.SIGINT)  # each rank's process group, as a terminal's Ctrl-C
    time.sleep(0.2)
    world.kill(signal.SIGINT)  # torchrun forwards its own SIGINT a moment later: the same Ctrl-C, not a second one
    assert world.join(timeout=120) == [130, 130]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "interrupted" and 2 <= status["step"] < 200
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == str(status["step"])
    assert (ckpts / f"iter_{status['step']:07d}" / "checksums.json").is_file()
    rank0 = (tmp_path / "rank0.log").read_text()
    assert "Ctrl-C: saving a checkpoint" in rank0 and f"interrupted by Ctrl-C at step {status['step']}" in rank0


def test_second_ctrl_c_aborts_at_once():
    from bio_megatron.training import signals

    stop = signals.StopRequest()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT and stop.keyboard
        os.kill(os.getpid(), signal.SIGINT)  # within the grace period: the launcher's echo, ignored
        stop._first_sigint -= signals.REPEAT_GRACE_S + 1  # as if the user pressed Ctrl-C again seconds later
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()


def test_ctrl_c_landing_during_the_agreement_is_kept_for_the_next_one(monkeypatch):
    """A SIGINT whose handler runs while the ranks' all-reduce is in flight (Python runs it right after the call
    returns) must not be erased by that reduce's result: the next agreement stops as Ctrl-C (exit 130), not as a
    scheduler's SIGTERM (exit 0). CI once saw exactly this under torchrun."""
    from bio_megatron.training import signals

    def reduce_while_the_signal_lands(flag, op=None):
        os.kill(os.getpid(), signal.SIGINT)  # the flag was built before; the handler runs as this returns

    monkeypatch.setattr(signals.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(signals.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(signals.dist, "all_reduce", reduce_while_the_signal_lands)
    stop = signals.StopRequest()
    try:
        assert stop.agreed() is False  # this reduce carried no signal yet
        monkeypatch.setattr(signals.dist, "all_reduce", lambda flag, op=None: None)
        assert stop.agreed() is True and stop.keyboard
    finally:
        stop.restore()


def test_ctrl_c_under_torchrun_saves_on_every_rank(pubmed_prefix, tmp_path):
    """A terminal's Ctrl-C reaches torchrun and its workers (one foreground group); torchrun then forwards its own
    SIGINT to them: still one save, on both ranks, and both stop with the one line."""
    import sys

    over = overrides(pubmed_prefix, tmp_path, "run", tp=2, steps=300, every=0)
    torchrun = Path(sys.executable).with_name("torchrun")
    p = subprocess.Popen([str(torchrun), "--nproc-per-node=2", "-m", "bio_megatron", "pretrain", "--config", str(TINY),
                          *over], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    try:
        _wait_for(lambda: _logged_steps(tmp_path / "run") >= 2 or p.poll() is not None)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "interrupted", out[-3000:]
    stopped = [line for line in out.splitlines() if f"interrupted by Ctrl-C at step {status['step']}" in line]
    assert len(stopped) == 2 and all(any(f"[rank {r}]" in line for line in stopped) for r in (0, 1)), out[-3000:]
    # torchrun itself prints the traceback of its own SignalException and exits 1: none comes from a worker.
    assert not [line for line in out.splitlines() if 'File "' in line and "/bio_megatron/" in line], out[-3000:]
    ckpt = tmp_path / "run" / "checkpoints" / f"iter_{status['step']:07d}"
    assert (ckpt / "checksums.json").is_file()


def _finetune_ctrl_c_at(argv: list[str], at_step: int, log_dir: str) -> int:
    """The real fine-tuning CLI in a forked rank; a real SIGINT reaches the process during step ``at_step``."""
    import bio_megatron.tasks.finetune as ft
    from bio_megatron.cli import main

    class CtrlCAt(ft.StopRequest):
        calls = 0

        def agreed(self) -> bool:
            CtrlCAt.calls += 1
            if CtrlCAt.calls == at_step:
                os.kill(os.getpid(), signal.SIGINT)
            return super().agreed()

    ft.StopRequest = CtrlCAt
    _log_to(str(Path(log_dir) / "rank0.log"))
    return main(argv)


def test_ctrl_c_during_finetuning_saves_and_exits_130(tmp_path):
    """Fine-tuning saves its resume state on Ctrl-C as on SIGTERM, and exits 130 like pretraining (it exited 0,
    so `finetune ... && predict ...` carried on with a model its user had interrupted)."""
    from finetune.ft_runs import RECIPES
    from harness import run_world

    argv = ["finetune", "ner", "--config", str(RECIPES["ner"]), "trainer.max_steps=20", "trainer.val_check_interval=10",
            "model.dataset.max_eval_examples=8", "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=cut"]
    (rc,) = run_world(1, _finetune_ctrl_c_at, argv, 2, str(tmp_path))
    log = (tmp_path / "rank0.log").read_text()
    assert rc == 130, log[-2000:]
    assert "interrupted by Ctrl-C at step 2" in log and "Traceback" not in log
    assert (tmp_path / "cut" / "seed42" / "resume" / "latest").is_file()  # the CLI runs a one-seed sweep
