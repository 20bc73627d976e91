"""``bio-megatron bench``: throughput benchmarks (``pretrain``: model training; ``data``: corpus pipeline;
``finetune`` / ``predict``: fine-tuning and ``predict ner`` against plain transformers).

The benchmark modules import torch and megatron-core only when they run, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Callable

from bio_megatron.utils.extras import require_transformers


def _with_transformers(command: str, run: Callable[[argparse.Namespace], int],
                       needs: Callable[[argparse.Namespace], bool] = lambda args: True):
    """``run`` after :func:`require_transformers` (when ``needs(args)``): the comparison side of these benchmarks
    is transformers (the ``[hf]`` extra), and a missing one must be one line before any measurement starts."""
    def checked(args: argparse.Namespace) -> int:
        if needs(args):
            require_transformers(command)
        return run(args)

    return checked


def register(sub: argparse._SubParsersAction) -> None:
    from bio_megatron.bench import data as bench_data
    from bio_megatron.bench import finetune as bench_finetune
    from bio_megatron.bench import predict as bench_predict
    from bio_megatron.bench import pretrain as bench_pretrain

    p = sub.add_parser("bench", help="throughput benchmarks (pretraining step, data pipeline, fine-tuning, predict)")
    b = p.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)

    pt = b.add_parser("pretrain", help="train-step tokens/s, TFLOP/s and MFU: ours vs Hugging Face MegatronBert",
                      description="Measure a full train step of our megatron-core model and of the same shape in "
                                  "Hugging Face MegatronBert (SDPA attention) in one run, on the current device; "
                                  "on GPU also the achievable matmul peak. See docs/BENCHMARKS.md.")
    bench_pretrain.add_arguments(pt)
    pt.set_defaults(func=_with_transformers("bench pretrain", bench_pretrain.run))

    dt = b.add_parser("data", help="extraction and tokenization throughput on the bundled real sample",
                      description="Corpus pipeline throughput against naive baselines, measured in one run.")
    bench_data.add_arguments(dt)
    # only Megatron-LM's preprocess_data.py side needs it (a BertTokenizer folder for that script)
    dt.set_defaults(func=_with_transformers("bench data --megatron-lm", bench_data.run, lambda a: bool(a.megatron_lm)))

    ft = b.add_parser("finetune", help="NER / classification fine-tuning: ours vs transformers, examples/s and one epoch",
                      description="Our fine-tuning train step against AutoModelFor{Token,Sequence}Classification with "
                                  "torch AdamW on the same weights, data, batch and precision, side by side; then one "
                                  "epoch end to end as two fresh processes. See docs/BENCHMARKS.md.")
    bench_finetune.add_arguments(ft)
    ft.set_defaults(func=_with_transformers("bench finetune", bench_finetune.run))

    pr = b.add_parser("predict", help="predict ner vs transformers' token-classification pipeline: sentences/s, RSS",
                      description="bio-megatron predict ner and pipeline(\"token-classification\") on the same "
                                  "sentences and weights, each a fresh process: sentences/s, start-up, peak RSS.")
    bench_predict.add_arguments(pr)
    pr.set_defaults(func=_with_transformers("bench predict", bench_predict.run))
