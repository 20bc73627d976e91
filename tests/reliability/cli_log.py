"""The CLI run in the pytest process with the project logger's records kept: the refusal tests read the one-line
message a bad input gets. The project logger does not propagate to the root logger (pytest's caplog sees
nothing), so a handler is added to it for the duration of the run."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from bio_megatron.cli import main
from bio_megatron.utils.log import get_logger


@contextlib.contextmanager
def project_records(level: int = logging.DEBUG) -> Iterator[list[logging.LogRecord]]:
    """The records the project logger emits at ``level`` and above while the block runs."""
    logger = get_logger()  # configures the project logger first: its first use clears handlers added before
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def run_cli(argv: list[str], level: int = logging.ERROR, sep: str = " ") -> tuple[int, str]:
    """Exit code of ``bio-megatron argv`` and its messages at ``level`` and above, joined by ``sep``."""
    with project_records(level) as records:
        rc = main(argv)
    return rc, sep.join(r.getMessage() for r in records)
