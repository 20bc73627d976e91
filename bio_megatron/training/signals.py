"""Stop requests: SIGTERM or SIGUSR1 (SLURM preemption / time limits) and SIGINT (Ctrl-C) ask the trainer to
save and exit cleanly.

The handler only sets a flag; the loop checks it between steps and agrees on it across ranks (a
signal may reach only some of them), so every rank saves the same step.

Ctrl-C reaches every process of the terminal's foreground group, so each rank of a ``torchrun`` or forked
world hears it, and ``torchrun`` itself forwards its own SIGINT to its workers a moment later: a second SIGINT
within :data:`REPEAT_GRACE_S` of the first is that echo and is ignored. A second Ctrl-C after that aborts at
once (``KeyboardInterrupt``), for a user who does not want to wait for the save.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist

from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
REPEAT_GRACE_S = 2.0


class StopRequest:
    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)):
        self.received: int | None = None
        self.keyboard = False
        """A SIGINT (Ctrl-C) was among the stop signals, on this rank or (after :meth:`agreed`) on any."""
        self._heard_sigint = False
        """What this rank's handler heard, never overwritten by :meth:`agreed`: a SIGINT landing while the
        all-reduce runs is counted in the next one instead of being erased by this one's result."""
        self._first_sigint: float | None = None
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_sigint is not None and now - self._first_sigint > REPEAT_GRACE_S:
                raise KeyboardInterrupt  # the second Ctrl-C: abort without waiting for the save
            if self._first_sigint is None:
                self._first_sigint = now
                log.warning("Ctrl-C: saving a checkpoint at the end of this step, then stopping "
                            "(press Ctrl-C again to abort without saving)")
            self._heard_sigint = True
            self.keyboard = True
        self.received = signum

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal (``keyboard`` then says whether any of them
        was a Ctrl-C, on every rank alike)."""
        flag = torch.tensor([1.0 if self.received is not None else 0.0, 1.0 if self._heard_sigint else 0.0])
        if torch.cuda.is_available():
            flag = flag.cuda()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.keyboard = bool(flag[1].item() > 0)
        return bool(flag[0].item() > 0)

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)


class Interrupted(BioMegatronError):
    """Training stopped on Ctrl-C after saving. Exit code 130 (the shell's code for SIGINT) rather than SIGTERM's 0:
    a script ``pretrain ... && export ...`` must not carry on with a model its user just interrupted, while a
    scheduler's SIGTERM/SIGUSR1 (preemption, time limit) exits 0 so that the job is requeued and resumes."""

    exit_code = 130
