"""Reading the files a score is computed from, so that bad input is an error and never a score.

A scorer fed an empty file, a binary file or the wrong file would otherwise print zeros (or raise a
``UnicodeDecodeError`` traceback) and exit 0, which is worse than failing: a zero looks like a result.
Every reader here raises :class:`~bio_megatron.utils.errors.DataError` naming the file, the line where
known, and what the file was expected to hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file

# A NUL byte never occurs in UTF-8 text we read, and almost always in the first few KB of a binary file
# (checkpoints, .bin shards, gzip): checking a prefix keeps the test cheap on big text files.
_SNIFF_BYTES = 8192


def _existing_file(path: str | Path, expected: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise DataError(f"is a directory (expected {expected})", str(path))
    # the one input check (utils/input_files.py): a FIFO, a symlink loop, a broken link or an unreadable file is
    # named as what it is, not "not found"; empty files are each reader's own error
    return check_input_file(path, f"input (expected {expected})", missing=f"file not found (expected {expected})",
                            empty=None)


def _binary_error(path: Path, head: bytes, expected: str) -> DataError | None:
    if b"\x00" not in head:
        return None
    lineno = head.count(b"\n", 0, head.index(b"\x00")) + 1
    return DataError(f"binary file, not text (expected {expected})", str(path), lineno)


def _decode_line(raw: bytes, path: Path, lineno: int, expected: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line; "
                        f"expected {expected})", str(path), lineno) from None


def check_text_file(path: str | Path, expected: str) -> Path:
    """Fail early on a missing, empty, binary or non-UTF-8 file, before a reader that would raise a
    traceback or count nothing."""
    path = _existing_file(path, expected)
    if not any(line.strip() for _, line in iter_lines(path, expected)):
        raise DataError(f"empty file (expected {expected})", str(path))
    return path


def iter_lines(path: str | Path, expected: str) -> Iterator[tuple[int, str]]:
    """``(line number, line without its newline)`` for every line of a UTF-8 text file."""
    path = _existing_file(path, expected)
    with open(path, "rb") as fh:
        err = _binary_error(path, fh.read(_SNIFF_BYTES), expected)
        if err is not None:
            raise err
        fh.seek(0)
        # binary lines split at b"\n" only: a \x0c, \x85 or \u2028 inside a line never starts another
        for lineno, raw in enumerate(fh, 1):
            line = _decode_line(raw, path, lineno, expected).rstrip("\r\n")
            # an editor's BOM is no part of the first label, token or document
            yield lineno, line.removeprefix("\ufeff") if lineno == 1 else line


def load_json(path: str | Path, expected: str) -> Any:
    """``json.loads`` of a UTF-8 file (a BOM is allowed); empty, binary or broken JSON names file and line."""
    path = _existing_file(path, expected)
    data = path.read_bytes()
    err = _binary_error(path, data[:_SNIFF_BYTES], expected)
    if err is not None:
        raise err
    if not data.strip():
        raise DataError(f"empty file (expected {expected})", str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # find the line only when there is one to report
        lineno = data.count(b"\n", 0, exc.start) + 1
        _decode_line(data.split(b"\n")[lineno - 1], path, lineno, expected)
        raise  # not reached: that line does not decode
    try:
        return json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise DataError(f"broken JSON: {exc.msg} (column {exc.colno}); expected {expected}",
                        str(path), exc.lineno) from None
    except RecursionError:  # "[[[[...": json's recursive decoder gives up before the input ends
        raise DataError(f"JSON nested too deeply; expected {expected}", str(path)) from None


def line_of(path: str | Path, needle: str) -> int | None:
    """1-based line of the first occurrence of ``needle`` in a text file (to point at a JSON record)."""
    try:
        for lineno, line in iter_lines(path, "text"):
            if needle in line:
                return lineno
    except DataError:
        return None
    return None


def first_few(ids: Iterable[Any], n: int = 3) -> str:
    """``'a', 'b', 'c' (and 4 more)``: enough ids to find the problem, not a wall of them."""
    ids = list(ids)
    shown = ", ".join(repr(i) for i in ids[:n])
    return shown + (f" (and {len(ids) - n} more)" if len(ids) > n else "")
