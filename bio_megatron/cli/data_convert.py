"""``bio-megatron data convert <format>``: an unpacked clinical release -> our IOB / BLUE TSV files, counts beside
the released sizes (tasks/clinical_convert.py). Registered under ``data`` by :mod:`bio_megatron.cli.data`."""

from __future__ import annotations

import argparse
import json
import sys


def _convert(args: argparse.Namespace) -> int:
    from bio_megatron.tasks.clinical_convert import convert_release

    result = convert_release(args.format, args.input, args.out, overwrite=args.overwrite)
    json.dump(result, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from bio_megatron.tasks.clinical_convert import FORMATS

    c = sub.add_parser("convert", help="an unpacked clinical release (i2b2 2010/2012/2014, ShARe/CLEFE; i2b2 2010 "
                                       "relations) -> train/dev/test IOB (relations: BLUE's TSV) files, with counts "
                                       "beside the released sizes")
    c.add_argument("format", choices=FORMATS, help="the release (the NER model.dataset.format of the same name reads "
                                                  "it directly; i2b2_2010_re writes what finetune re reads with "
                                                  "format i2b2_2010)")
    c.add_argument("--input", required=True, help="the release's folder, as unpacked")
    c.add_argument("--out", required=True, help="folder for train.tsv, dev.tsv, test.tsv and counts.json")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier data convert output")
    c.set_defaults(func=_convert)
