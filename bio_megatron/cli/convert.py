"""``bio-megatron export hf`` and ``bio-megatron import hf``: checkpoints to and from Hugging Face."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="export a checkpoint (any TP/PP layout) to another format")
    es = e.add_subparsers(dest="format", metavar="FORMAT", required=True)
    hf = es.add_parser("hf", help="a Hugging Face MegatronBertFor* folder (safetensors, config, vocab, label map)")
    hf.add_argument("--checkpoint", required=True, help="checkpoint directory, its checkpoints folder or run dir")
    hf.add_argument("--out", required=True, help="output folder (written atomically)")
    hf.set_defaults(func=run_export)

    i = sub.add_parser("import", help="import weights from another format as a BioMegatron checkpoint")
    isub = i.add_subparsers(dest="format", metavar="FORMAT", required=True)
    ihf = isub.add_parser("hf", help="a Hugging Face MegatronBert folder -> checkpoint loadable at any layout")
    ihf.add_argument("--model", required=True, help="HF folder (config.json, *.safetensors, vocab.txt)")
    ihf.add_argument("--out", required=True, help="checkpoint directory to write")
    ihf.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from bio_megatron.export.hf import export_hf
    from bio_megatron.parallel.distributed import teardown

    try:
        print(json.dumps(export_hf(args.checkpoint, args.out), indent=2))
    finally:
        teardown()
    return 0


def run_import(args: argparse.Namespace) -> int:
    from bio_megatron.export.hf import import_hf
    from bio_megatron.parallel.distributed import teardown

    try:
        print(json.dumps(import_hf(args.model, args.out), indent=2))
    finally:
        teardown()
    return 0
