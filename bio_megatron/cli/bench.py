"""``bio-megatron bench``: throughput benchmarks (``pretrain``: model training; ``data``: corpus pipeline).

The benchmark modules import torch and megatron-core only when they run, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from bio_megatron.bench import data as bench_data
    from bio_megatron.bench import pretrain as bench_pretrain

    p = sub.add_parser("bench", help="throughput benchmarks (pretraining step, data pipeline)")
    b = p.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)

    pt = b.add_parser("pretrain", help="train-step tokens/s, TFLOP/s and MFU: ours vs Hugging Face MegatronBert",
                      description="Measure a full train step of our megatron-core model and of the same shape in "
                                  "Hugging Face MegatronBert (SDPA attention) in one run, on the current device; "
                                  "on GPU also the achievable matmul peak. See docs/BENCHMARKS.md.")
    bench_pretrain.add_arguments(pt)
    pt.set_defaults(func=bench_pretrain.run)

    dt = b.add_parser("data", help="extraction and tokenization throughput on the bundled real sample",
                      description="Corpus pipeline throughput against naive baselines, measured in one run.")
    bench_data.add_arguments(dt)
    dt.set_defaults(func=bench_data.run)
