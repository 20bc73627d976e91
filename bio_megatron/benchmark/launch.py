"""How a cell's ``bio-megatron finetune`` starts, and how a stop request reaches it.

* ``local``: the CLI's own ``main`` in a forked child. The suite imports torch and megatron-core once, so a cell
  starts in well under a second instead of paying their import (6-15 s) per cell; the child is exactly
  ``bio-megatron finetune ...`` (same argument parsing, same exit codes), one process on the CPU. Where torch sees
  a GPU the cell is ``python -m bio_megatron finetune ...`` in a process of its own instead
  (``parallel.distributed.forks_can_use_the_device`` says why).
* ``torchrun``: ``torchrun --standalone --nproc-per-node=N -m bio_megatron finetune ...`` on this host.
* ``srun``: inside a SLURM allocation (``slurm/benchmark.sbatch``), one task per GPU on every node of the job,
  ranks from ``SLURM_*`` as ``slurm/common.sh`` launches them.

SIGUSR1 (SLURM's time-limit warning, a preempting scheduler) or SIGTERM sent to the suite is passed on to the
running fine-tuning, which saves ``<run>/resume`` and exits 0; the suite then stops before the next cell, and
a rerun continues that run where it stopped. The signal is repeated every few seconds until the run exits: a
process still starting up ignores USR1 (as ``slurm/common.sh`` does) until the trainer's handler is in place.
When the suite dies of anything (SIGKILL included) its running cell gets SIGTERM (Linux's parent-death
signal) and saves the same way, instead of running on unseen.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bio_megatron.benchmark.folder import WORLD_VARS
from bio_megatron.utils.log import get_logger, setup_logging

log = get_logger(__name__)
LAUNCHERS = ("local", "torchrun", "srun", "slurm")
RESEND_S = 10.0
EX_INTERRUPTED = 75  # EX_TEMPFAIL: stopped by a signal before the cell finished; rerun (or requeue) to continue


class StopRequest:
    """SIGTERM / SIGUSR1 to the suite: remember it; the running cell gets it passed on (see ``wait``)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGUSR1)}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            log.warning("received %s: stopping after the running cell saves where it is", signal.Signals(signum).name)
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


@dataclass
class Child:
    pid: int
    group: bool
    """Signal the whole process group (torchrun: the agent ignores USR1, its workers must get it)."""
    popen: subprocess.Popen | None = None

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return None if pid == 0 else os.waitstatus_to_exitcode(status)

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum) if self.group else os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class Launcher:
    kind: str
    nproc: int = 1
    # local: the `bio-megatron` entry point a forked cell runs (cli.main), handed down by the command so that this
    # layer does not import the CLI above it
    entry: Callable[[list[str]], int] | None = field(default=None, compare=False)

    def command(self, args: list[str]) -> list[str]:
        """The command line that runs ``bio-megatron <args>`` under this launcher (as shown by ``--dry-run``)."""
        if self.kind == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.nproc}",
                    "-m", "bio_megatron", *args]
        if self.kind == "srun":
            nodes = int(os.environ.get("SLURM_NNODES", "1"))
            return ["srun", "--kill-on-bad-exit=1", "--wait=60", f"--nodes={nodes}", f"--ntasks-per-node={self.nproc}",
                    f"--ntasks={nodes * self.nproc}", "bash", "-c", 'trap "" USR1; exec "$@"', "bio-megatron",
                    sys.executable, "-m", "bio_megatron", *args]
        return ["bio-megatron", *args]

    def forks(self) -> bool:
        """local: fork the CLI from this process (no GPU), or start it as a process of its own (GPU)."""
        from bio_megatron.parallel.distributed import forks_can_use_the_device

        return self.kind == "local" and forks_can_use_the_device()

    def prepare(self) -> None:
        """local without a GPU: import torch and megatron-core once, before the first fork."""
        if self.forks():
            import megatron.core  # noqa: F401
            from megatron.core.models.bert import bert_model  # noqa: F401

    def start(self, args: list[str], log_path: Path) -> Child:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.kind == "local" and self.entry is None:
            raise ValueError("Launcher('local') needs entry= (the bio-megatron entry point, cli.main)")
        if self.forks():
            return _fork_cli(self.entry, args, log_path)
        env = {k: v for k, v in os.environ.items() if self.kind == "srun" or k not in WORLD_VARS}
        command = [sys.executable, "-m", "bio_megatron", *args] if self.kind == "local" else self.command(args)
        with open(log_path, "a") as fh:
            fh.write(f"$ {shlex.join(self.command(args))}\n")
            fh.flush()
            group, parent = self.kind == "torchrun", os.getpid()
            # torchrun's agent dies of USR1, and so would a local cell before its trainer's handler is in place
            setup = (lambda: _ignore_usr1_child(parent)) if self.kind != "srun" else (lambda: _die_with(parent))
            p = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=group, preexec_fn=setup)
        return Child(p.pid, group, p)


def _die_with(parent: int) -> None:
    """Linux: SIGTERM to this cell when the suite dies, even of SIGKILL: the fine-tuning saves where it is and
    stops instead of running on unseen and colliding with the rerun (its run lock), which then continues it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the suite died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _ignore_usr1_child(parent: int) -> None:
    _die_with(parent)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # kept across exec; the trainer installs its own handler


def _fork_cli(entry: Callable[[list[str]], int], args: list[str], log_path: Path) -> Child:
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return Child(pid, False)
    rc = 1
    try:  # the child: never return into the suite's code
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the trainer installs its own handler
        _die_with(parent)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        for var in WORLD_VARS:  # a world of its own, even when the suite runs inside a SLURM step
            os.environ.pop(var, None)
        # new streams on the redirected descriptors (the inherited ones may write elsewhere, e.g. under pytest)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        setup_logging(force=True)
        os.write(1, f"$ {shlex.join(['bio-megatron', *args])}\n".encode())
        rc = entry(args)
    except BaseException:  # noqa: BLE001  (reported in the cell's log, as the CLI would print it)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def wait(child: Child, stop: StopRequest) -> int:
    """Wait for the child, passing a stop request on (and repeating it) until it exits; its exit code."""
    sent: float | None = None
    while (rc := child.poll()) is None:
        if stop.signum is not None and (sent is None or time.monotonic() - sent >= RESEND_S):
            child.signal(stop.signum)
            sent = time.monotonic()
        time.sleep(0.2)
    return rc
