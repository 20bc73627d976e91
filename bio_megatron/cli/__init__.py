"""``bio-megatron`` command line: one sub-command module per concern, each exposing ``register(subparsers)``.

Heavy imports (torch, megatron-core) happen inside the command handlers, so ``--help`` and the
pure-Python commands (evaluate, data extraction) start fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings
from pathlib import Path

from bio_megatron import __version__
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

# Each module registers its own top-level command(s); order is the order shown in --help.
_COMMAND_MODULES = (
    "bio_megatron.cli.pretrain",
    "bio_megatron.cli.distill",
    "bio_megatron.cli.finetune",
    "bio_megatron.cli.evaluate",
    "bio_megatron.cli.predict",
    "bio_megatron.cli.convert",
    "bio_megatron.cli.data",
    "bio_megatron.cli.vocab",
    "bio_megatron.cli.analyse",
    "bio_megatron.cli.bench",
    "bio_megatron.cli.benchmark",
    "bio_megatron.cli.report",
)


# What a command reads and what it writes, by argparse dest: every command's outputs are checked against its
# inputs and against system paths before it runs (utils.io.check_output_path), so a new command whose options
# are named like these gets the check for free.
INPUT_DESTS = ("input", "checkpoint", "model", "generator", "gold", "pred", "data", "predictions", "nbest",
               "na_prob_file", "golden", "label_ids", "files", "train", "eval", "ner_file", "vocab", "config")
OUTPUT_DESTS = ("out", "output", "json_out", "json", "output_prefix")
_SUBCOMMAND_DESTS = ("task", "evaluate_command", "data_command", "vocab_command", "format", "analyse_command")
# Single-file outputs whose command does not already refuse a folder or an unwritable place before its work.
_FILE_OUTPUTS = {("data", "pubmed"): "output", ("data", "pmc"): "output", ("evaluate", "bioasq-submission"): "out"}


def _flat(value: object) -> list[str]:
    if value is None or isinstance(value, bool):
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _outputs(command: tuple[str, ...], dest: str, value: str) -> list[str]:
    """The files an output option stands for: a prefix writes ``.bin``/``.idx``; ``predict qa`` an n-best file."""
    if dest == "output_prefix":
        return [value, f"{value}.bin", f"{value}.idx"]
    if command[:2] == ("predict", "qa"):
        out = Path(value)
        return [value, str(out.with_name(out.stem + ".nbest.json"))]
    return [value]


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output that is one of the command's inputs or a system path."""
    from bio_megatron.utils.io import check_output_file, check_output_path

    command = tuple([args.command] + [getattr(args, d) for d in _SUBCOMMAND_DESTS
                                      if isinstance(getattr(args, d, None), str)])
    inputs = [p for d in INPUT_DESTS for p in _flat(getattr(args, d, None))]
    for dest in OUTPUT_DESTS:
        for value in _flat(getattr(args, dest, None)):
            option = "--json" if dest in ("json_out", "json") else "--" + dest.replace("_", "-")
            for target in _outputs(command, dest, value):
                check_output_path(target, inputs, f"the output ({option})")
            if _FILE_OUTPUTS.get(command[:2]) == dest:
                check_output_file(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bio-megatron",
        description="Model-parallel pretraining, fine-tuning and evaluation of biomedical Megatron BERT.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command module not written yet
                continue
            raise
        module.register(sub)
    return parser


def _quiet_dependencies() -> None:
    """megatron-core warns at import about optional kernels (apex, TE) it falls back from; the step log
    already says which layer spec runs, so keep the console readable."""
    if not sys.warnoptions:
        for module in (r"megatron(\..*)?", r"torch(\..*)?", r"transformers(\..*)?"):
            warnings.filterwarnings("ignore", module=module)
    logging.getLogger("megatron").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    _quiet_dependencies()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        check_paths(args)
        rc = args.func(args)
        sys.stdout.flush()  # inside the try: a reader that went away shows up here, not at interpreter exit
    except BioMegatronError as exc:
        get_logger("cli").error("%s", exc)
        sys.stderr.flush()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()
    return int(rc or 0)


def _stdout_closed() -> int:
    """The reader of our stdout went away (``bio-megatron evaluate ... | head``): stop quietly, no traceback.

    Python's documented recipe (library/signal, "Note on SIGPIPE"): point stdout at devnull so that the
    interpreter's final flush of what is still buffered cannot raise again. Exit status 0, as
    ``cli.output.emit`` does: the reader chose to stop reading and got what it read, so a
    ``set -o pipefail`` script running ``... | head`` does not fail. Errors are reported on stderr with
    their own status (2 for bad input) whatever becomes of stdout.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (in-process callers): nothing to redirect
        pass
    return 0
