"""The two schedules of ``bench pretrain`` and what each side's timed steps give.

``Measurement`` holds what a run has measured so far (step times, peak memory and profiles per side) and turns it
into each side's figures and the ratio; ``sequential`` and ``interleaved`` time the sides. Our side comes from a
builder (``bench/pretrain.py::ours_step``), called here so that its model can be dropped, and its memory freed,
before the next side is built.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from bio_megatron.bench.hf_pretrain import hf_step
from bio_megatron.bench.hf_process import HFProcess
from bio_megatron.bench.op_profile import profile_steps
from bio_megatron.bench.timing import Step, free_memory, peak_memory_gib, throughput, time_steps
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)

# our_adam ("auto", "fused", "default") -> (a train step, what it runs, its initial weights in HF's layout)
OursBuilder = Callable[[str], tuple[Step, dict[str, str], dict]]


@dataclass
class Measurement:
    """What the run has measured so far; ``figures()`` is the result. ``res`` describes the run (device, shape,
    peaks, schedule); ``flops`` are each side's training FLOPs per sequence (ours on the padded vocabulary)."""

    args: argparse.Namespace
    res: dict[str, Any]
    flops_ours: float
    flops_hf: float
    ours_info: dict[str, str] = field(default_factory=dict)
    hf_info: dict[str, Any] = field(default_factory=dict)
    times: dict[str, list] = field(default_factory=dict)
    memory: dict[str, float | None] = field(default_factory=dict)
    profiles: dict[str, dict] = field(default_factory=dict)

    @property
    def label_ours(self) -> str:
        return f"ours ({self.ours_info['attention']})"

    @property
    def label_hf(self) -> str:
        return f"hf ({self.args.hf_attention})"

    def side(self, info: dict, label: str, flops: float) -> dict:
        """One side's figures from its timed steps (and its profile's share of the step)."""
        rates = throughput(self.times[label], self.args.micro_batch, self.args.seq, flops,
                           self.res["peak_tflops_datasheet"], self.res["peak_tflops_measured_matmul"],
                           self.memory.get(label))
        prof = self.profiles.get(label)
        if prof and "total_ms_per_step" in prof:  # kernel time / timed step: well below 1, launches set the pace
            prof = {**prof, "share_of_step": prof["total_ms_per_step"] / 1e3 / rates["step_time_s"]}
        return {**info, **rates, **({"profile": prof} if prof else {})}

    def figures(self) -> dict[str, Any]:
        """Everything measured so far: the run, our side, and where timed the baseline and the ratios."""
        out = {**self.res, "ours": self.side(self.ours_info, self.label_ours, self.flops_ours)}
        if self.label_hf in self.times:
            out["hf"] = self.side(self.hf_info, self.label_hf, self.flops_hf)
            out["ratio_tokens_per_s"] = out["ours"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
            # median step times: robust to a few steps slowed by other processes' load
            out["ratio_median_step"] = out["hf"]["step_time_median_s"] / out["ours"]["step_time_median_s"]
        return out

    def so_far(self) -> None:
        """Write what was measured (``--json``): a later part that fails, hangs or runs out of time leaves it."""
        if self.args.json and not self.args.skip_hf:
            write_json_atomic(self.args.json, {"hf": "not measured: the run ended before the transformers side did",
                                               **self.figures()})

    def profiled(self, label: str, step: Step) -> None:
        """``--profile`` more steps of one side, after its timed ones (so peak memory is the steps' own)."""
        if not self.args.profile:
            return
        try:
            self.profiles[label] = profile_steps(step, self.args.profile)
        except Exception as e:  # noqa: BLE001  the profiler (CUPTI) may be refused where the timing ran fine
            log.warning("%s: profiling failed, the timings stand: %s: %s", label, type(e).__name__, e)
            self.profiles[label] = {"error": f"{type(e).__name__}: {e}"}

    def timed(self, label: str, step: Step) -> None:
        """One side's timed steps alone, and its peak memory."""
        self.times.update(time_steps({label: step}, self.args.steps, self.args.warmup))
        self.memory[label] = peak_memory_gib()


def sequential(m: Measurement, build_ours: OursBuilder, dtype: "torch.dtype") -> None:
    """One side after the other, each model freed before the next is built: peak GPU memory per side. Our side,
    its profile, ``--also-our-adam`` (the same model and batch, only the Adam kernel differs), then the baseline."""
    args = m.args
    ours, m.ours_info, weights = build_ours(args.our_adam)
    m.timed(m.label_ours, ours)
    m.so_far()  # after each part: what a later part that fails or hangs would lose
    m.profiled(m.label_ours, ours)
    m.so_far()
    del ours
    free_memory()
    if args.also_our_adam:
        kernel = args.also_our_adam
        alt, alt_info, _ = build_ours(kernel)
        label = f"{m.label_ours}, Adam {kernel}"
        m.timed(label, alt)
        m.res[f"ours_adam_{kernel}"] = m.side(alt_info, label, m.flops_ours)
        m.so_far()
        del alt
        free_memory()
    if not args.skip_hf:
        hf, m.hf_info["optimizer"] = hf_step(args, dtype, weights)
        m.timed(m.label_hf, hf)
        m.so_far()
        m.profiled(m.label_hf, hf)


def interleaved(m: Measurement, build_ours: OursBuilder, dtype: "torch.dtype") -> None:
    """Both models resident, their timed steps alternating (the baseline in a process of its own unless
    ``--hf-process shared``); peak memory is of both together."""
    args = m.args
    ours, m.ours_info, weights = build_ours(args.our_adam)
    hf_process = HFProcess(args, dtype, weights) if args.hf_process == "own" else None
    hf, m.hf_info["optimizer"] = (hf_process.step, hf_process.optimizer) if hf_process else hf_step(args, dtype, weights)
    m.hf_info["process"] = args.hf_process
    del weights
    try:
        m.times = time_steps({m.label_ours: ours, m.label_hf: hf}, args.steps, args.warmup)
        m.profiled(m.label_ours, ours)
        if not hf_process:  # a side in another process is not this profiler's to see
            m.profiled(m.label_hf, hf)
    finally:
        if hf_process:
            hf_process.close()
    m.res["peak_memory_gib_both"] = peak_memory_gib()  # both models resident: not separable per side
