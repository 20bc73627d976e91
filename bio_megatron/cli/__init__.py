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

from bio_megatron import __version__
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

# Each module registers its own top-level command(s); order is the order shown in --help.
_COMMAND_MODULES = (
    "bio_megatron.cli.pretrain",
    "bio_megatron.cli.finetune",
    "bio_megatron.cli.evaluate",
    "bio_megatron.cli.predict",
    "bio_megatron.cli.convert",
    "bio_megatron.cli.data",
    "bio_megatron.cli.vocab",
    "bio_megatron.cli.analyse",
    "bio_megatron.cli.bench",
    "bio_megatron.cli.benchmark",
)


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
    ``cli.evaluate.emit`` does: the reader chose to stop reading and got what it read, so a
    ``set -o pipefail`` script running ``... | head`` does not fail. Errors are reported on stderr with
    their own status (2 for bad input) whatever becomes of stdout.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (in-process callers): nothing to redirect
        pass
    return 0
