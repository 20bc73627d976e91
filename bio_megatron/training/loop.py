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
    hooks: dict = field(default_factory=dict)  # on_step(step, loss, lr, gnorm), on_validate(step), should_stop(step)


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


def train_step(s: LoopState) -> tuple[float, float | None]:
    s.model.train()
    s.model.zero_grad_buffer()
    s.optimizer.zero_grad()
    losses = run_batches(s, s.train_batches(s.step), forward_only=False)
    _, grad_norm, _ = s.optimizer.step()
    s.scheduler.step(increment=1)
    return reduce_losses(losses), (float(grad_norm) if grad_norm is not None else None)


@torch.no_grad()
def evaluate(s: LoopState, num_batches: int) -> float | None:
    s.model.eval()
    values = [reduce_losses(run_batches(s, mbs, forward_only=True))
              for k in range(num_batches) if (mbs := s.valid_batches(k))]
    s.model.train()
    return sum(values) / len(values) if values else None


def train(s: LoopState) -> str:
    """Run until ``max_steps`` or a stop request; returns "finished" or "interrupted"."""
    h = s.hooks
    while s.step < s.max_steps:
        loss, grad_norm = train_step(s)
        s.step += 1
        lr = s.optimizer.param_groups[0]["lr"]
        h["on_step"](s.step, loss, lr, grad_norm)
        if h["should_validate"](s.step):
            h["on_validate"](s.step, evaluate(s, h["val_batches"]))
        if h["should_save"](s.step) and s.step < s.max_steps:
            h["save"](s.step)
        if h["should_stop"]():
            h["save"](s.step)
            return "interrupted"
    return "finished"
