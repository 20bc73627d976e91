"""Nothing a run starts outlives it: SIGKILL the ranks of a real 2-rank pretraining while it saves
checkpoints, and no process of that run is left (before issue 11, the Manager process that
dist-checkpointing's saves started stayed alive with PPID 1).

Only the rank processes are killed (not their process group, as a scheduler killing the launcher's
children would), then every process that was a descendant of a rank, or is still in a rank's process
group (the harness gives each rank its own), must be gone.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
from harness import start_world

from engine.pretrain_runs import overrides, pretrain_rank


def _descendants(pids: list[int]) -> set[int]:
    found: set[int] = set()
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return found


def _in_groups(groups: list[int]) -> set[int]:
    left = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) in groups and proc.status() != psutil.STATUS_ZOMBIE:
                left.add(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return left


def test_sigkill_during_saves_leaves_no_process(pubmed_prefix, tmp_path):
    over = overrides(pubmed_prefix, tmp_path, "killed", tp=2, steps=200, every=1)
    world = start_world(2, pretrain_rank, over)
    ranks = world.pids()
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    seen: set[int] = set()
    deadline = time.time() + 120
    while not (latest.exists() and int(latest.read_text()) >= 2) and time.time() < deadline:
        seen |= _descendants(ranks)  # whatever the ranks start, recorded while they run
        time.sleep(0.01)
    assert latest.exists(), "no checkpoint was saved"
    seen |= _descendants(ranks)
    for pid in ranks:  # mid-run, saving every step: very likely inside a save
        os.kill(pid, signal.SIGKILL)
    for proc in world.procs:
        proc.join(10)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            left = {p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
            left |= _in_groups(ranks)
            if not left:
                break
            time.sleep(0.1)
        assert not left, [psutil.Process(p).cmdline() for p in left if psutil.pid_exists(p)]
    finally:
        world.kill()  # whatever the assertion found must not outlive the test either
