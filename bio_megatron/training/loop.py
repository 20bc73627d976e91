"""The training loop, written against megatron-core's ``get_forward_backward_func()``.

A task supplies ``forward_step(data_iterator, model) -> (output, loss_func)``; pretraining and the
fine-tuning tasks differ only in model head, batch and loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.pipeline_parallel import get_forward_backward_func

from bio_megatron.training.guards import params_finite, step_is_nonfinite
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


@dataclass
class LoopState:
    """What the loop needs; built by the task's set-up code."""

    model: torch.nn.Module              # the DDP-wrapped stage
    optimizer: object
    scheduler: object
    forward_step: Callable
    train_batches: Callable[[int], list]  # step -> this rank's micro-batches of that global batch
    valid_batches: Callable[[int], list]
    seq_length: int
    micro_batch_size: int
    max_steps: int
    step: int = 0
    hooks: dict = field(default_factory=dict)  # on_step(step, StepResult), on_validate(step), should_stop(step)
    max_nonfinite_steps: int = 3
    """Stop (``"diverged"``) after this many non-finite steps in a row."""
    report_keys: tuple[str, ...] = ()
    """Further keys of the task's per-micro-batch report, averaged like the loss into ``StepResult.extra``."""
    nonfinite_streak: int = 0
    skipped_steps: int = 0
    """Steps without a parameter update in this process's run (non-finite, or fp16 loss-scaler overflow)."""

    def checkpoint_safe(self) -> bool:
        """May the current state be committed as a checkpoint? Not right after a non-finite step (the data
        position moved on, the model did not, and the next step is likely bad too), nor with NaN/Inf weights."""
        return self.nonfinite_streak == 0 and params_finite(self.model)


@dataclass
class StepResult:
    loss: float
    grad_norm: float | None
    lr: float = 0.0
    nonfinite: bool = False
    """The loss or some rank's gradients were NaN/Inf: no update (agreed by every rank)."""
    skipped: bool = False
    """No parameter update this step (non-finite, or the fp16 loss scaler found an overflow)."""
    extra: dict[str, float] = field(default_factory=dict)
    """``LoopState.report_keys`` averaged over micro-batches and data-parallel ranks."""


def reduce_losses(losses: list[dict], key: str = "loss") -> float:
    """Mean of the micro-batch losses over the data-parallel group, made visible on every rank."""
    value = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")
    if ps.is_pipeline_last_stage() and losses:
        value += torch.stack([d[key].float() for d in losses]).mean()
        dist.all_reduce(value, group=ps.get_data_parallel_group())
        value /= ps.get_data_parallel_world_size()
    # Only the last stage holds the loss: summing over the pipeline group hands it to every stage.
    dist.all_reduce(value, group=ps.get_pipeline_model_parallel_group())
    return float(value.item())


def run_batches(s: LoopState, microbatches: list, forward_only: bool) -> list[dict]:
    return get_forward_backward_func()(
        forward_step_func=s.forward_step, data_iterator=iter(microbatches), model=[s.model],
        num_microbatches=len(microbatches), seq_length=s.seq_length, micro_batch_size=s.micro_batch_size,
        forward_only=forward_only)


def train_step(s: LoopState) -> StepResult:
    """One global batch. As Megatron-LM's ``train_step``: when the update is skipped (here: a non-finite loss
    or gradient on any rank, which megatron-core's fp32/bf16 optimizers do not check) the parameters,
    optimizer state and LR schedule stay as they were; the caller still advances step and data position."""
    s.model.train()
    s.model.zero_grad_buffer()
    s.optimizer.zero_grad()
    reports = run_batches(s, s.train_batches(s.step), forward_only=False)
    loss = reduce_losses(reports)
    extra = {k: reduce_losses(reports, k) for k in s.report_keys}
    if step_is_nonfinite(loss, s.model, s.optimizer):
        return StepResult(loss, None, nonfinite=True, skipped=True, extra=extra)
    updated, grad_norm, _ = s.optimizer.step()
    if updated:
        s.scheduler.step(increment=1)
    return StepResult(loss, float(grad_norm) if grad_norm is not None else None, skipped=not updated, extra=extra)


@torch.no_grad()
def evaluate(s: LoopState, num_batches: int) -> float | None:
    s.model.eval()
    values = [reduce_losses(run_batches(s, mbs, forward_only=True))
              for k in range(num_batches) if (mbs := s.valid_batches(k))]
    s.model.train()
    return sum(values) / len(values) if values else None


def train(s: LoopState) -> str:
    """Run until ``max_steps``, a stop request or too many non-finite steps in a row; returns "finished",
    "interrupted" or "diverged" (the caller reports the last one as a failure)."""
    h = s.hooks
    while s.step < s.max_steps:
        r = train_step(s)
        s.step += 1
        s.skipped_steps += r.skipped
        s.nonfinite_streak = s.nonfinite_streak + 1 if r.nonfinite else 0
        r.lr = s.optimizer.param_groups[0]["lr"]
        h["on_step"](s.step, r)
        if s.nonfinite_streak >= s.max_nonfinite_steps:
            return "diverged"
        if h["should_validate"](s.step):
            h["on_validate"](s.step, evaluate(s, h["val_batches"]))
        if h["should_save"](s.step) and s.step < s.max_steps:
            guarded_save(s, h["save"], "periodic")
        if h["should_stop"]():
            guarded_save(s, h["save"], "interruption")
            return "interrupted"
    return "finished"


def guarded_save(s: LoopState, save: Callable[[int], object], why: str) -> bool:
    """Save unless the state is non-finite (then warn and keep the previous checkpoint as ``latest``)."""
    if s.checkpoint_safe():
        save(s.step)
        return True
    log.warning("%s checkpoint at step %d skipped: the model is at a non-finite point (%d non-finite step(s) in "
                "a row); the previous checkpoint stays the latest", why, s.step, s.nonfinite_streak)
    return False
