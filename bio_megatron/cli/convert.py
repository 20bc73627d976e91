"""``bio-megatron export hf`` and ``bio-megatron import hf``: checkpoints to and from Hugging Face."""

from __future__ import annotations

import argparse
import json

# Only our own earlier output may be replaced: a folder holding anything else is refused even with --overwrite.
_OVERWRITE_HELP = "replace --out if it is an earlier `{}` output (never a folder holding other files)"


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="export a checkpoint (any TP/PP layout) to another format")
    es = e.add_subparsers(dest="format", metavar="FORMAT", required=True)
    hf = es.add_parser("hf", help="a Hugging Face MegatronBertFor* folder (safetensors, config, vocab, label map)")
    hf.add_argument("--checkpoint", required=True, help="checkpoint directory, its checkpoints folder or run dir")
    hf.add_argument("--out", required=True, help="output folder: new or empty (written atomically)")
    hf.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("export hf"))
    hf.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="weights' dtype in the folder (default fp32; from a bf16/fp16 run: its fp32 main parameters)")
    hf.set_defaults(func=run_export)

    i = sub.add_parser("import", help="import weights from another format as a BioMegatron checkpoint")
    isub = i.add_subparsers(dest="format", metavar="FORMAT", required=True)
    ihf = isub.add_parser("hf", help="a Hugging Face MegatronBert folder -> checkpoint loadable at any layout")
    ihf.add_argument("--model", required=True, help="HF folder (config.json, *.safetensors, vocab.txt)")
    ihf.add_argument("--out", required=True, help="checkpoint directory to write: new or empty (atomically)")
    ihf.add_argument("--generator", help="ELECTRA only: the generator's folder (ElectraForMaskedLM) beside the "
                                         "discriminator given with --model (default: a fresh generator)")
    ihf.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import hf"))
    _add_verify(ihf, "transformers' own model loaded from the folder")
    ihf.set_defaults(func=run_import)
    _register_megatron_lm(es, isub)
    _register_nemo(es, isub)


def run_export(args: argparse.Namespace) -> int:
    from bio_megatron.export.hf import export_hf
    from bio_megatron.parallel.distributed import teardown

    try:
        print(json.dumps(export_hf(args.checkpoint, args.out, overwrite=args.overwrite, dtype=args.dtype), indent=2))
    finally:
        teardown()
    return 0


def run_import(args: argparse.Namespace) -> int:
    from bio_megatron.export.hf import import_hf
    from bio_megatron.parallel.distributed import teardown

    try:
        result = import_hf(args.model, args.out, overwrite=args.overwrite, verify=args.verify,
                           tolerance=args.tolerance, generator=args.generator)
        print(json.dumps(result, indent=2))
    finally:
        teardown()
    return 0 if result.get("verify", {}).get("verified", True) else 1


def _add_verify(parser: argparse.ArgumentParser, reference: str) -> None:
    """``--verify`` / ``--tolerance`` for an importer whose independent reference is ``reference``."""
    parser.add_argument("--verify", action="store_true", help=f"run {reference} and the imported checkpoint on a "
                        "padded batch; exit 1 when the max absolute logit difference exceeds --tolerance")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="for --verify (default 1e-4, fp32)")


def _register_megatron_lm(es: argparse._SubParsersAction, isub: argparse._SubParsersAction) -> None:
    """``export megatron-lm`` / ``import megatron-lm`` (:mod:`bio_megatron.interchange.megatron_lm`)."""
    e = es.add_parser("megatron-lm", help="a Megatron-LM legacy checkpoint (release/mp_rank_TT/model_optim_rng.pt)")
    e.add_argument("--checkpoint", required=True, help="pretraining checkpoint, its checkpoints folder or run dir")
    e.add_argument("--out", required=True, help="output folder: new or empty (written atomically)")
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the written shards (default 1)")
    e.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("export megatron-lm"))
    e.set_defaults(func=run_export_megatron_lm)
    i = isub.add_parser("megatron-lm", help="a Megatron-LM checkpoint, legacy (any TP/PP, checkpoint_version 0-3) "
                                           "or distributed (torch_dist) "
                                           "-> checkpoint loadable at any layout")
    i.add_argument("--checkpoint", required=True, help="Megatron-LM folder (latest_checkpointed_iteration.txt, "
                                                       "release/ or iter_NNNNNNN/), or a single .pt / .zip file")
    i.add_argument("--out", required=True, help="checkpoint directory to write: new or empty (atomically)")
    i.add_argument("--vocab", help="the vocab.txt the model was trained with (default: one beside the checkpoint)")
    i.add_argument("--num-attention-heads", type=int, help="only for files without saved args (default hidden/64)")
    i.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import megatron-lm"))
    i.add_argument("--verify", action="store_true", help="run the source weights (transformers' MegatronBert) and "
                                                        "the imported checkpoint on a padded batch; exit 1 when "
                                                        "the max absolute logit difference exceeds --tolerance")
    i.add_argument("--tolerance", type=float, default=1e-4, help="for --verify (default 1e-4, fp32)")
    i.set_defaults(func=run_import_megatron_lm)


def run_export_megatron_lm(args: argparse.Namespace) -> int:
    from bio_megatron.interchange.megatron_lm import export_megatron_lm
    from bio_megatron.parallel.distributed import teardown

    try:
        print(json.dumps(export_megatron_lm(args.checkpoint, args.out, args.tp, args.overwrite), indent=2))
    finally:
        teardown()
    return 0


def run_import_megatron_lm(args: argparse.Namespace) -> int:
    from bio_megatron.interchange.megatron_lm import import_megatron_lm
    from bio_megatron.parallel.distributed import teardown

    try:
        result = import_megatron_lm(args.checkpoint, args.out, args.vocab, args.num_attention_heads,
                                    args.overwrite, verify=args.verify, tolerance=args.tolerance)
        print(json.dumps(result, indent=2))
    finally:
        teardown()
    return 0 if result.get("verify", {}).get("verified", True) else 1


def _register_nemo(es: argparse._SubParsersAction, isub: argparse._SubParsersAction) -> None:
    """``export nemo`` / ``import nemo`` (:mod:`bio_megatron.interchange.nemo`)."""
    e = es.add_parser("nemo", help="a NeMo .nemo archive (MegatronBertModel, or the NER/QA/RE task model)")
    e.add_argument("--checkpoint", required=True, help="checkpoint directory, its checkpoints folder or run dir")
    e.add_argument("--out", required=True, help="the .nemo file to write (atomically)")
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the saved weights (mp_rank_TT/)")
    e.add_argument("--pp", type=int, default=1, help="pipeline size of the saved weights (tp_rank_TT_pp_rank_PPP/)")
    e.add_argument("--mcore", action="store_true", help="megatron-core names in a dist checkpoint (mcore_bert: true)")
    e.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    e.set_defaults(func=run_export_nemo)
    i = isub.add_parser("nemo", help="a NeMo .nemo archive (any TP/PP or dist layout) -> checkpoint loadable "
                                     "at any layout")
    i.add_argument("--model", required=True, help="the .nemo file")
    i.add_argument("--out", required=True, help="checkpoint directory to write: new or empty (atomically)")
    i.add_argument("--num-attention-heads", type=int, help="only for archives whose config names none")
    i.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import nemo"))
    _add_verify(i, "transformers' MegatronBert holding the archive's encoder weights")
    i.set_defaults(func=run_import_nemo)


def run_export_nemo(args: argparse.Namespace) -> int:
    from bio_megatron.interchange.nemo import export_nemo
    from bio_megatron.parallel.distributed import teardown

    try:
        print(json.dumps(export_nemo(args.checkpoint, args.out, args.tp, args.pp, args.mcore, args.overwrite),
                         indent=2))
    finally:
        teardown()
    return 0


def run_import_nemo(args: argparse.Namespace) -> int:
    from bio_megatron.interchange.nemo import import_nemo
    from bio_megatron.parallel.distributed import teardown

    try:
        result = import_nemo(args.model, args.out, args.num_attention_heads, args.overwrite, verify=args.verify,
                             tolerance=args.tolerance)
        print(json.dumps(result, indent=2))
    finally:
        teardown()
    return 0 if result.get("verify", {}).get("verified", True) else 1
