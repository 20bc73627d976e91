"""Reading ``predict``'s input files: one line is one document, and undecodable bytes are an error.

Python's text mode splits lines at a lone ``\\r`` too, and ``str.splitlines`` at ``\\x0b``, ``\\x0c``,
``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``: text pasted from PDFs and word processors holds these
inside a paragraph, and every extra split would be an extra output record, shifting every later id. Lines
here end at ``\\n`` only (``\\r\\n`` is one line end); a BOM before the first line is dropped. Invalid UTF-8 is
a :class:`~bio_megatron.utils.errors.DataError` naming the file and line (exit 2), never replaced silently:
a replacement character would shift no offsets but would change the words the model sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.utils.errors import DataError


def text_lines(path: str | Path, expected: str) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for every line, blank ones included (each is one document)."""
    yield from iter_lines(path, expected)


def json_lines(path: str | Path, expected: str) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file."""
    for lineno, line in iter_lines(path, expected):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError as exc:  # JSONDecodeError, or an integer literal past Python's digit limit
            detail = f"{exc.msg} (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise DataError(f"broken JSON: {detail}; expected {expected}", str(path), lineno) from None
