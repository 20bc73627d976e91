"""``bio-megatron analyse label-bias``: how much of an NER evaluation split is seen-and-labelled in training."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyse", help="dataset analyses (label bias)")
    an = p.add_subparsers(dest="analyse_command", metavar="ANALYSIS", required=True)
    lb = an.add_parser("label-bias", help="label-bias statistics of an NER dataset (paper Table 8 analysis)",
                       description="Share of evaluation entity mentions whose string is labelled with the "
                                   "same type in training; prints one JSON object.")
    lb.add_argument("--train", required=True, help="training IOB file (token<TAB>tag)")
    lb.add_argument("--eval", required=True, nargs="+", help="evaluation IOB file(s), e.g. devel.tsv test.tsv")
    lb.set_defaults(func=run_label_bias)


def run_label_bias(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.label_bias import label_bias
    from bio_megatron.tasks.ner_data import read_iob

    train = [(s.words, s.tags) for s in read_iob(args.train)]
    out = {"train": args.train, "eval": {}}
    for path in args.eval:
        out["eval"][path] = label_bias(train, [(s.words, s.tags) for s in read_iob(path)])
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
