"""Atomic outputs: write to a temporary path beside the target, rename when complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

from bio_megatron.utils.errors import DataError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` only on success.

    Works for files and directories: whatever the caller creates at the yielded path is moved into place.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    os.close(fd)
    os.unlink(tmp)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if target.is_dir() and not target.is_symlink() and tmp_path.is_dir():
            shutil.rmtree(target)
        os.replace(tmp_path, target)
    finally:
        if tmp_path.is_dir():
            shutil.rmtree(tmp_path, ignore_errors=True)
        elif tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_open(target: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """``open()`` a temporary file that replaces ``target`` only when the block finishes without error."""
    with atomic_path(target) as tmp:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_json_atomic(target: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    with atomic_open(target, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=indent, sort_keys=False)
        fh.write("\n")


def load_json(path: str | os.PathLike, missing: str = "file not found") -> Any:
    """``json.load`` with a :class:`DataError` naming the file and line on broken JSON."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing, str(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"broken JSON: {exc.msg} (column {exc.colno})", str(path), exc.lineno) from None


def iter_json_lines(path: str | os.PathLike, missing: str = "file not found") -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file; broken JSON is a
    :class:`DataError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing, str(path))
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"broken JSON: {exc.msg} (column {exc.colno})", str(path), lineno) from None
