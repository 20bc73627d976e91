"""SLURM preemption / time limits: SIGTERM or SIGUSR1 asks the trainer to save and exit cleanly.

The handler only sets a flag; the loop checks it between steps and agrees on it across ranks (a
signal may reach only some of them), so every rank saves the same step.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


class StopRequest:
    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)):
        self.received: int | None = None
        self._previous = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        self.received = signum

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal."""
        flag = torch.tensor([1.0 if self.received is not None else 0.0])
        if torch.cuda.is_available():
            flag = flag.cuda()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
