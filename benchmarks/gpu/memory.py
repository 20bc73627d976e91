"""The 1.2b memory check of the GPU check: does a training step of the 1.2b model fit one 80 GB GPU with the
distributed optimizer and activation recomputation, and what is the peak memory per micro-batch size?

One process, TP1, the code path of ``bio-megatron pretrain``: ``build_stage`` (the model with the config's
recompute settings, megatron DDP), megatron-core's optimizer (distributed optimizer on), and full train steps
through ``get_forward_backward_func()`` on the synthetic full-length MLM batch of ``bench pretrain``. For each
micro-batch size, smallest first, two steps (the first allocates Adam's state), then ``max_memory_allocated`` of
the second's forward-backward and of its optimizer step, each, and ``max_memory_reserved`` over the step; a size
that runs out of memory is recorded as such and ends the sweep.
``fits_80gb`` compares the reserved peak with an 80 GB card's capacity (H100 80GB HBM3: 81,559 MiB), so a larger
GPU (H200) still answers the question. The static estimate of ``training/memory.py`` is recorded beside it.

On CPU (``check.sh --dry-run``) it runs at ``--size tiny`` and records RSS instead of GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

CARD_80GB_BYTES = 81559 * 2**20
_SEED = 1234


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1.2b")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batches", default="1,2,4,8,16,32,64", help="comma-separated, ascending")
    p.add_argument("--precision", default="bf16", choices=["bf16", "16", "32"])
    p.add_argument("--recompute", default="full", choices=["none", "selective", "full"],
                   help="activations_checkpoint_granularity (full: method uniform, 1 layer per group)")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--json", required=True, help="write the results here")
    return p.parse_args(argv)


def _rss_peak_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class _Peaks:
    """CUDA peak memory per phase of one step. A step's peak is either the activations' (forward-backward) or the
    optimizer's (torch's foreach Adam holds temporaries the size of the fp32 parameters), and only the first grows
    with the micro-batch: one number per step would hide which. Records nothing when ``on`` is false."""

    def __init__(self, on: bool) -> None:
        import torch

        self.on, self.cuda, self.allocated, self.reserved = on, torch.cuda, {}, 0
        if on:
            self.cuda.synchronize()
            self.cuda.reset_peak_memory_stats()

    def phase(self, name: str) -> None:
        """End phase ``name``: record its peak allocation and start the next phase's."""
        if not self.on:
            return
        self.cuda.synchronize()
        self.allocated[name] = self.cuda.max_memory_allocated() / 2**30
        self.reserved = max(self.reserved, self.cuda.max_memory_reserved())
        self.cuda.reset_peak_memory_stats()

    def summary(self) -> dict[str, float]:
        return {"peak_allocated_gib": max(self.allocated.values()), "peak_reserved_gib": self.reserved / 2**30,
                **{f"peak_allocated_{k}_gib": v for k, v in self.allocated.items()}}


def _model_config(args: argparse.Namespace, micro_batch: int):
    from bio_megatron.config.pretrain import ModelConfig

    full = args.recompute == "full"
    return ModelConfig(size=args.size, encoder_seq_length=args.seq, max_position_embeddings=max(512, args.seq),
                       micro_batch_size=micro_batch, global_batch_size=micro_batch, use_distributed_optimizer=True,
                       activations_checkpoint_granularity=None if args.recompute == "none" else args.recompute,
                       activations_checkpoint_method="uniform" if full else None,
                       activations_checkpoint_num_layers=1 if full else None)


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bio_megatron.bench.pretrain_common import synthetic_batch
    from bio_megatron.config.pretrain import PretrainConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.models.bert import precision_dtype
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel, teardown
    from bio_megatron.training import memory
    from bio_megatron.training.optimizer import build_optimizer
    from bio_megatron.training.pretrain import build_stage, forward_step, to_device

    gpu = torch.cuda.is_available()
    dtype = precision_dtype(args.precision)
    sizes = [int(x) for x in args.micro_batches.split(",")]
    cfg = PretrainConfig()
    cfg.trainer.seed = _SEED
    cfg.model = _model_config(args, sizes[0])
    est = memory.estimate(cfg.model, padded_vocab_size(args.vocab_size), dtype != torch.float32, 1)
    res: dict[str, Any] = {
        "size": args.size, "seq": args.seq, "dtype": str(dtype).removeprefix("torch."), "recompute": args.recompute,
        "distributed_optimizer": True, "device": torch.cuda.get_device_name() if gpu else "CPU",
        "gpu_total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else None,
        "static_estimate": est.as_dict(), "card_80gb_gib": CARD_80GB_BYTES / 2**30, "per_micro_batch": [],
    }
    init_distributed()
    try:
        init_model_parallel(1, 1, _SEED)
        model, ddp = build_stage(cfg, args.vocab_size, dtype)
        optimizer = build_optimizer(cfg.model.optim, [ddp], dtype, clip_grad=1.0, use_distributed_optimizer=True)
        fwd_bwd = get_forward_backward_func()
        fstep = partial(forward_step, binary_head=False)
        for mb in sizes:
            batch = to_device({k: v for k, v in synthetic_batch(args.vocab_size, mb, args.seq, False).items()
                                if v is not None})
            row: dict[str, Any] = {"micro_batch": mb}
            try:
                for step in range(2):
                    peaks = _Peaks(gpu and step == 1)
                    t = time.perf_counter()
                    ddp.zero_grad_buffer()
                    optimizer.zero_grad()
                    losses = fwd_bwd(forward_step_func=fstep, data_iterator=iter([batch]), model=[ddp],
                                     num_microbatches=1, seq_length=args.seq, micro_batch_size=mb, forward_only=False)
                    peaks.phase("forward_backward")
                    optimizer.step()
                    peaks.phase("optimizer")
                row["step_s"] = time.perf_counter() - t
                row["loss"] = float(losses[0]["loss"])
                if gpu:
                    row.update(peaks.summary())
                    row["fits_80gb"] = row["peak_reserved_gib"] * 2**30 < CARD_80GB_BYTES
                else:
                    row["peak_rss_gib"] = _rss_peak_gib()
            except torch.OutOfMemoryError as e:
                row["out_of_memory"] = str(e).splitlines()[0]
                row["fits_80gb"] = False
                res["per_micro_batch"].append(row)
                break
            finally:
                del batch
            res["per_micro_batch"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        fitting = [r["micro_batch"] for r in res["per_micro_batch"] if r.get("fits_80gb")]
        res["largest_micro_batch_fitting_80gb"] = max(fitting) if fitting else None
    finally:
        teardown()
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    res = sweep(args)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)
    print(json.dumps({k: res[k] for k in ("size", "recompute", "largest_micro_batch_fitting_80gb")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
