"""``bio-megatron export FORMAT`` and ``bio-megatron import FORMAT``: checkpoints to and from other formats.

Both commands iterate :data:`FORMATS`, one :class:`FormatCommands` entry per format (Hugging Face, Megatron-LM,
NeMo): its options, its help and the library functions that convert. A new format is one entry here (plus its
readers and writers of ``formats/state.ModelState``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Callable

from bio_megatron.utils.extras import require_transformers

# Only our own earlier output may be replaced: a folder holding anything else is refused even with --overwrite.
_OVERWRITE_HELP = "replace --out if it is an earlier `{}` output (never a folder holding other files)"
_SOURCE_HELP = "checkpoint directory, its checkpoints folder or run dir"
_OUT_HELP = "checkpoint directory to write: new or empty (atomically)"


@dataclass(frozen=True)
class FormatCommands:
    """One format's ``export`` and ``import`` sub-commands."""

    name: str                                             # the sub-command (formats/detect.py FORMATS)
    export_help: str
    import_help: str
    export_options: Callable[[argparse.ArgumentParser], None]
    import_options: Callable[[argparse.ArgumentParser], None]
    export: Callable[[argparse.Namespace], dict]          # the summary printed as JSON
    import_: Callable[[argparse.Namespace], dict]         # ... its ``verify`` decides the exit code

    def run_export(self, args: argparse.Namespace) -> int:
        if self.name == "hf":  # transformers' config and tokenizer classes write the folder
            require_transformers(f"export {self.name}")
        from bio_megatron.parallel.distributed import teardown

        try:
            print(json.dumps(self.export(args), indent=2))
        finally:
            teardown()
        return 0

    def run_import(self, args: argparse.Namespace) -> int:
        """Exit 1 when ``--verify`` found the import off by more than ``--tolerance`` (nothing is written then)."""
        if getattr(args, "verify", False):  # every format's --verify reference is a transformers model
            require_transformers(f"import {self.name} --verify")
        from bio_megatron.parallel.distributed import teardown

        try:
            result = self.import_(args)
            print(json.dumps(result, indent=2))
        finally:
            teardown()
        return 0 if result.get("verify", {}).get("verified", True) else 1


def _verify_options(parser: argparse.ArgumentParser, reference: str) -> None:
    """``--verify`` / ``--tolerance`` for an importer whose independent reference is ``reference``."""
    parser.add_argument("--verify", action="store_true", help=f"run {reference} and the imported checkpoint on a "
                        "padded batch; exit 1 when the max absolute logit difference exceeds --tolerance")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="for --verify (default 1e-4, fp32)")


# --- Hugging Face ---------------------------------------------------------------------------------------------
def _hf_export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help=_SOURCE_HELP)
    p.add_argument("--out", required=True, help="output folder: new or empty (written atomically)")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("export hf"))
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="weights' dtype in the folder (default fp32; from a bf16/fp16 run: its fp32 main parameters)")


def _hf_import_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF folder (config.json, *.safetensors, vocab.txt)")
    p.add_argument("--out", required=True, help=_OUT_HELP)
    p.add_argument("--generator", help="ELECTRA only: the generator's folder (ElectraForMaskedLM) beside the "
                                       "discriminator given with --model (default: a fresh generator)")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import hf"))
    _verify_options(p, "transformers' own model loaded from the folder")


def classify_dataset(task_name: str) -> tuple[list[str], str]:
    """A BLURB dataset's labels and mode (single, regression, multi): what ``export hf`` of a classify model needs
    from ``tasks/``, which sits above ``formats/``, so it is handed down from here."""
    from bio_megatron.tasks.classify_data import dataset

    data = dataset(task_name)
    return list(data.labels), data.mode


def _hf_export(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.hf.convert import export_hf

    return export_hf(args.checkpoint, args.out, overwrite=args.overwrite, dtype=args.dtype,
                     classify_dataset=classify_dataset)


def _hf_import(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.hf.convert import import_hf

    return import_hf(args.model, args.out, overwrite=args.overwrite, verify=args.verify, tolerance=args.tolerance,
                     generator=args.generator)


# --- Megatron-LM ----------------------------------------------------------------------------------------------
def _mlm_export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="pretraining checkpoint, its checkpoints folder or run dir")
    p.add_argument("--out", required=True, help="output folder: new or empty (written atomically)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the written shards (default 1)")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("export megatron-lm"))


def _mlm_import_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="Megatron-LM folder (latest_checkpointed_iteration.txt, "
                                                       "release/ or iter_NNNNNNN/), or a single .pt / .zip file")
    p.add_argument("--out", required=True, help=_OUT_HELP)
    p.add_argument("--vocab", help="the vocab.txt the model was trained with (default: one beside the checkpoint)")
    p.add_argument("--num-attention-heads", type=int, help="only for files without saved args (default hidden/64)")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import megatron-lm"))
    _verify_options(p, "the source weights (transformers' MegatronBert)")


def _mlm_export(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.megatron_lm.convert import export_megatron_lm

    return export_megatron_lm(args.checkpoint, args.out, args.tp, args.overwrite)


def _mlm_import(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.megatron_lm.convert import import_megatron_lm

    return import_megatron_lm(args.checkpoint, args.out, args.vocab, args.num_attention_heads, args.overwrite,
                              verify=args.verify, tolerance=args.tolerance)


# --- NeMo -----------------------------------------------------------------------------------------------------
def _nemo_export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help=_SOURCE_HELP)
    p.add_argument("--out", required=True, help="the .nemo file to write (atomically)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the saved weights (mp_rank_TT/)")
    p.add_argument("--pp", type=int, default=1, help="pipeline size of the saved weights (tp_rank_TT_pp_rank_PPP/)")
    p.add_argument("--mcore", action="store_true", help="megatron-core names in a dist checkpoint (mcore_bert: true)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _nemo_import_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the .nemo file")
    p.add_argument("--out", required=True, help=_OUT_HELP)
    p.add_argument("--num-attention-heads", type=int, help="only for archives whose config names none")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP.format("import nemo"))
    _verify_options(p, "transformers' MegatronBert holding the archive's encoder weights")


def _nemo_export(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.nemo.convert import export_nemo

    return export_nemo(args.checkpoint, args.out, args.tp, args.pp, args.mcore, args.overwrite)


def _nemo_import(args: argparse.Namespace) -> dict:
    from bio_megatron.formats.nemo.convert import import_nemo

    return import_nemo(args.model, args.out, args.num_attention_heads, args.overwrite, verify=args.verify,
                       tolerance=args.tolerance)


HF = FormatCommands(
    "hf", "a Hugging Face folder of the model's family (safetensors, config, tokenizer, label map, model card)",
    "a Hugging Face folder (any registered family) -> checkpoint loadable at any layout",
    _hf_export_options, _hf_import_options, _hf_export, _hf_import)
MEGATRON_LM = FormatCommands(
    "megatron-lm", "a Megatron-LM legacy checkpoint (release/mp_rank_TT/model_optim_rng.pt)",
    "a Megatron-LM checkpoint, legacy (any TP/PP, checkpoint_version 0-3) or distributed (torch_dist) -> checkpoint "
    "loadable at any layout",
    _mlm_export_options, _mlm_import_options, _mlm_export, _mlm_import)
NEMO = FormatCommands(
    "nemo", "a NeMo .nemo archive (MegatronBertModel, or the NER/QA/RE task model)",
    "a NeMo .nemo archive (any TP/PP or dist layout) -> checkpoint loadable at any layout",
    _nemo_export_options, _nemo_import_options, _nemo_export, _nemo_import)
FORMATS: tuple[FormatCommands, ...] = (HF, MEGATRON_LM, NEMO)
"""Every format ``export`` and ``import`` offer, in ``--help`` order."""

# The per-format entry points by their historical names (tests call them with a Namespace).
run_export, run_import = HF.run_export, HF.run_import
run_export_megatron_lm, run_import_megatron_lm = MEGATRON_LM.run_export, MEGATRON_LM.run_import
run_export_nemo, run_import_nemo = NEMO.run_export, NEMO.run_import


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="export a checkpoint (any TP/PP layout) to another format")
    es = e.add_subparsers(dest="format", metavar="FORMAT", required=True)
    i = sub.add_parser("import", help="import weights from another format as a BioMegatron checkpoint")
    isub = i.add_subparsers(dest="format", metavar="FORMAT", required=True)
    for fmt in FORMATS:
        p = es.add_parser(fmt.name, help=fmt.export_help)
        fmt.export_options(p)
        p.set_defaults(func=fmt.run_export)
        p = isub.add_parser(fmt.name, help=fmt.import_help)
        fmt.import_options(p)
        p.set_defaults(func=fmt.run_import)
