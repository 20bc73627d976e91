"""Wall-time measurement for ``bench pretrain``: device-synchronised laps per part of a train step, timed steps of
several sides interleaved, and the throughput figures derived from them."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def sync() -> None:
    """Wait for the GPU (a no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# One train step that returns its wall time per part: "forward_backward", "optimizer", "other".
Step = Callable[[], dict[str, float]]
PARTS = ("forward_backward", "optimizer", "other")


class Laps:
    """Consecutive wall-time laps of one step, the device synchronised at every boundary."""

    def __init__(self) -> None:
        sync()
        self.parts = dict.fromkeys(PARTS, 0.0)
        self._t = time.perf_counter()

    def __call__(self, part: str) -> None:
        sync()  # GPU work is asynchronous: time what ran, not what was queued
        now = time.perf_counter()
        self.parts[part] += now - self._t
        self._t = now


def time_steps(sides: dict[str, Step], steps: int, warmup: int) -> dict[str, list[dict[str, float]]]:
    """Per side, the part times of each timed step. Warmup steps (allocator, kernel selection, optimizer state)
    are excluded. With several sides the timed steps alternate between them, in an order that flips every
    round (A B, B A, ...), so that load from other processes drifting during the run hits every side alike."""
    for name, step in sides.items():
        for i in range(warmup):
            step()
            log.info("%s: warmup step %d/%d", name, i + 1, warmup)
    times: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    order = list(sides)
    for i in range(steps):
        for name in order if i % 2 == 0 else order[::-1]:
            parts = sides[name]()
            times[name].append(parts)
            log.info("%s: step %d/%d %.3f s (%s)", name, i + 1, steps, sum(parts.values()),
                     ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
    return times


def throughput(times: list[dict[str, float]], micro_batch: int, seq: int, flops_per_seq: float,
               peak: float | None, measured_peak: float | None, memory_gib: float | None) -> dict[str, Any]:
    """Tokens/s, TFLOP/s and MFU from the mean step time, the median step time, and the mean of each part."""
    totals = [sum(t.values()) for t in times]
    dt = sum(totals) / len(totals)
    tflops = micro_batch * flops_per_seq / dt / 1e12
    return {"step_time_s": dt, "step_time_median_s": statistics.median(totals), "tokens_per_s": micro_batch * seq / dt,
            "tflops": tflops, "mfu_datasheet": tflops / peak if peak else None,
            "mfu_measured_peak": tflops / measured_peak if measured_peak else None,
            # mean seconds per part of the step: where the ratio ours/HF comes from
            "breakdown_s": {p: sum(t[p] for t in times) / len(times) for p in PARTS},
            "peak_memory_gib": memory_gib}
