"""``bio-megatron data download {ner,blurb}``: the public fine-tuning sets of ``corpus/datasets.py``.

Kept apart from ``cli/data.py`` (the NCBI downloads) so that file only routes the two new sources here."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
DATASET_SOURCES = ("ner", "blurb")


def add_arguments(d: argparse.ArgumentParser) -> None:
    from bio_megatron.corpus.datasets import MIRROR_ENV

    d.add_argument("--name", action="append", default=None,
                   help="ner/blurb: a dataset to fetch (repeatable; --list shows them)")
    d.add_argument("--list", action="store_true", help="ner/blurb: print the table of datasets and exit")
    d.add_argument("--mirror", default=os.environ.get(MIRROR_ENV),
                   help=f"ner/blurb: a folder or URL laid out like raw.githubusercontent.com (env {MIRROR_ENV})")


def run(args: argparse.Namespace) -> int:
    """Print the licence of each chosen set, then fetch it; one JSON object on stdout."""
    from bio_megatron.corpus.datasets import download_dataset, get_dataset, list_datasets

    if args.list:
        json.dump(list_datasets(args.source), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.name or not args.out:
        raise DataError(f"data download {args.source} needs --name NAME and --out DIR (or --list)")
    sets = [get_dataset(n, args.source) for n in args.name]  # all names checked before any download
    results = []
    for d in sets:
        # the licence goes to stdout before any byte is fetched: the user accepts it by downloading
        sys.stdout.write(f"{d.name}: licence {d.licence} <{d.licence_url}>\n")
        sys.stdout.flush()
        results.append(download_dataset(d.name, args.out, group=args.source, mirror=args.mirror,
                                        retries=args.retries, timeout=args.timeout))
    json.dump({"datasets": results}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
