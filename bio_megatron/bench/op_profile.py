"""Where a benchmark side's step time goes: a few steps under ``torch.profiler``, reduced to the operators (CPU) or
kernels (GPU) that take the most self time, per step. ``bench pretrain --profile`` records it for each side in its
JSON, so that one GPU run both measures the ratio and shows what to change (GPU time here comes in minutes).

Not named ``profile.py``: ``bench/`` holds scripts run by path (``hf_baseline.py``), whose folder then comes first
on ``sys.path``, and a ``profile.py`` there shadows the standard library's, which ``cProfile`` imports."""

from __future__ import annotations

from typing import Any, Callable

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

TOP = 25  # rows kept per side: the head of the distribution, where a change pays


def profile_steps(step: Callable[[], Any], steps: int = 3) -> dict[str, Any]:
    """Run ``step`` ``steps`` times under the profiler (after the timed steps: warm) and return the busiest
    operators or kernels by self time: name, calls per step, milliseconds per step, share of the total."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    # GPU: the kernels' device time (an operator's device time is its kernels': counting both would count twice);
    # CPU: the operators' own time
    kind, attr = ((DeviceType.CUDA, "self_device_time_total") if gpu else (DeviceType.CPU, "self_cpu_time_total"))
    events = [e for e in prof.key_averages() if e.device_type == kind and getattr(e, attr) > 0]
    total_us = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    rows = [{"name": e.key, "calls_per_step": e.count / steps, "ms_per_step": getattr(e, attr) / steps / 1e3,
             "share": getattr(e, attr) / total_us} for e in events[:TOP]]
    log.info("profiled %d steps: %.2f ms of %s self time per step; busiest: %s", steps, total_us / steps / 1e3,
             "kernel" if gpu else "operator", ", ".join(f"{r['name']} {100 * r['share']:.0f}%" for r in rows[:3]))
    return {"steps": steps, "time": "kernel (device)" if gpu else "operator (CPU)",
            "total_ms_per_step": total_us / steps / 1e3, "top": rows}
