"""What keeps a run honest: the non-finite step guard and the run-directory lock, both agreed by every rank.

Every decision here is reduced over the whole world (tensor-, pipeline- and data-parallel ranks alike):
a rank that skipped an update, or saved, or quit while its peers did not would leave the model's shards
out of step with each other, or the job hung in a collective.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from bio_megatron.utils.errors import BioMegatronError, LockError
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def any_rank(flag: bool | torch.Tensor) -> bool:
    """True on every rank when ``flag`` is true on any rank."""
    value = flag.float().reshape(1) if isinstance(flag, torch.Tensor) else torch.tensor([1.0 if flag else 0.0])
    if torch.cuda.is_available():
        value = value.cuda()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def _nonfinite(tensors) -> torch.Tensor:
    """One device flag (no host sync per tensor): does any tensor hold a NaN or an Inf?"""
    flags = [(~torch.isfinite(t)).any() for t in tensors if t is not None and t.numel()]
    return torch.stack(flags).any() if flags else torch.tensor(False)


def _grad_tensors(model) -> list[torch.Tensor]:
    # megatron-core DDP keeps every gradient in contiguous buffers (``grad_data``); with the distributed
    # optimizer only this rank's shard is reduced, but a NaN/Inf anywhere in a local gradient also makes
    # the reduced value non-finite, so checking the whole local buffer never misses one.
    buffers = getattr(model, "buffers", None)
    if isinstance(buffers, list):
        return [b.grad_data for b in buffers + list(getattr(model, "expert_parallel_buffers", []))]
    return [getattr(p, "main_grad", p.grad) for p in model.parameters()]


def _scales_loss(optimizer) -> bool:
    """fp16 with a loss scaler: an Inf gradient is routine there, and the optimizer itself skips that step
    and lowers the scale (megatron's found_inf path); our guard must not steal those steps from it."""
    return any(getattr(o, "grad_scaler", None) is not None for o in getattr(optimizer, "chained_optimizers", [optimizer]))


def step_is_nonfinite(loss: float, model, optimizer) -> bool:
    """Agreed on every rank: the step's reduced loss or any rank's gradients are NaN/Inf."""
    bad = torch.tensor(False) if _scales_loss(optimizer) else _nonfinite(_grad_tensors(model))
    return any_rank(bad | (not math.isfinite(loss)))


def params_finite(model) -> bool:
    """Agreed on every rank: all parameters of every shard are finite (checked before a checkpoint is committed)."""
    return not any_rank(_nonfinite([p.detach() for p in model.parameters()]))


@contextlib.contextmanager
def run_dir_lock(run_dir: Path, what: str) -> Iterator[None]:
    """Hold ``<run_dir>/run.lock`` for the ``with`` block, or raise the same error on every rank.

    Only global rank 0 takes the lock (ranks may sit on several nodes; one holder per run); the others
    learn the outcome from it, so a second run into the same directory fails on all ranks at once,
    before any of them writes there. Released at the end and on any error (and by the kernel on a crash).
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    with contextlib.ExitStack() as stack:
        outcome: list[tuple[str, str] | None] = [None]
        error: BioMegatronError | None = None
        if rank == 0:
            try:
                stack.enter_context(exclusive_lock(Path(run_dir) / "run.lock", what))
            except BioMegatronError as exc:
                error, outcome[0] = exc, (type(exc).__name__, str(exc))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(outcome, src=0)
        if outcome[0] is not None:
            kind, message = outcome[0]
            raise error if error is not None else (LockError if kind == "LockError" else BioMegatronError)(message)
        yield
