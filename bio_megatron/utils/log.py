"""The project's one logger. Rank 0 logs at INFO; other ranks only warnings, unless BIO_MEGATRON_LOG_ALL_RANKS=1."""

from __future__ import annotations

import logging
import os
import sys

_LOGGER_NAME = "bio_megatron"
_configured = False


def get_logger(name: str | None = None) -> logging.Logger:
    """Child logger of the project logger (``bio_megatron.<name>``)."""
    setup_logging()
    return logging.getLogger(_LOGGER_NAME if not name else f"{_LOGGER_NAME}.{name.removeprefix('bio_megatron.')}")


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def setup_logging(level: int | None = None, force: bool = False) -> None:
    """Configure the project logger once: one line per record on stderr, rank-tagged when distributed."""
    global _configured
    if _configured and not force:
        return
    rank = _rank()
    if level is None:
        all_ranks = os.environ.get("BIO_MEGATRON_LOG_ALL_RANKS") == "1"
        level = logging.INFO if (rank == 0 or all_ranks) else logging.WARNING
    logger = logging.getLogger(_LOGGER_NAME)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    world = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
    tag = f"[rank {rank}] " if world and world != "1" else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    _configured = True
