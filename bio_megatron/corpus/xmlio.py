"""Reading NCBI XML (plain or gzip) with errors that name the file and line, and a shared progress meter.

NCBI files are large and arrive over flaky links, so every way a file can be broken (truncated gzip,
malformed XML, a stray non-UTF-8 byte, an empty download) must surface as one clear ``DataError``
that names the file, never as a bare ``EOFError`` from deep inside ``gzip``.
"""

from __future__ import annotations

import gzip
import time
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import IO, Iterator

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_progress_log = get_logger("corpus.progress")
_GZIP_MAGIC = b"\x1f\x8b"


def open_binary(path: str | Path) -> IO[bytes]:
    """Open ``path`` for reading bytes, transparently gunzipping by content (not by file name)."""
    path = check_input_file(path, empty="empty file (0 bytes): an interrupted download?")
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


def iter_elements(path: str | Path, tags: set[str]) -> Iterator[ET.Element]:
    """Stream the top-level elements named in ``tags`` from an XML file, clearing each after use.

    Memory stays flat however large the file is: parsed records are dropped from the tree as soon as
    the caller has moved on. Any decoding or parse failure becomes a ``DataError`` naming the file and
    the line where the parser stopped.
    """
    fh = open_binary(path)
    parser = ET.XMLPullParser(events=("start", "end"))
    depth = 0
    root: ET.Element | None = None
    lines_fed = 0
    try:
        while True:
            try:
                chunk = fh.read(1 << 16)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                raise DataError(f"corrupt or truncated gzip stream ({exc}); the last complete line read was "
                                f"line {lines_fed} (re-download the file)", str(path)) from None
            if not chunk:
                parser.close()
                break
            lines_fed += chunk.count(b"\n")
            parser.feed(chunk)
            for event, elem in parser.read_events():
                if event == "start":
                    depth += 1
                    if root is None:
                        root = elem
                    continue
                depth -= 1
                if depth == 1 and elem.tag in tags:
                    yield elem
                    if root is not None:
                        root.remove(elem)  # drop the finished record so memory does not grow
                elif depth == 1 and root is not None:
                    root.remove(elem)
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        msg = str(exc)
        if "invalid token" in msg or "encoding" in msg:
            msg += " (malformed XML or a byte that is not valid UTF-8)"
        raise DataError(f"XML parse error: {msg}", str(path), line) from None
    finally:
        fh.close()


def text_of(elem: ET.Element | None, skip: frozenset[str] = frozenset()) -> str:
    """All text inside ``elem`` (tails included), leaving out sub-elements whose tag is in ``skip``."""
    if elem is None:
        return ""
    parts: list[str] = []

    def walk(e: ET.Element) -> None:
        if e.text:
            parts.append(e.text)
        for child in e:
            if _local(child.tag) not in skip:
                walk(child)
            if child.tail:
                parts.append(child.tail)

    walk(elem)
    return " ".join("".join(parts).split())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


class Progress:
    """Rate-limited progress lines (items/s, tokens/s, ETA) through the project logger."""

    def __init__(self, what: str, total: int | None = None, every_s: float = 10.0,
                 total_bytes: int | None = None):
        self.what, self.total, self.every_s, self.total_bytes = what, total, every_s, total_bytes
        self.start = self.last = time.perf_counter()
        self.done = 0
        self.tokens = 0
        self.bytes = 0
        self.docs = 0

    def update(self, n: int = 1, tokens: int = 0, nbytes: int = 0, docs: int = 0) -> None:
        self.done += n
        self.tokens += tokens
        self.bytes += nbytes
        self.docs += docs
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            _progress_log.info("%s", self.line())

    def line(self) -> str:
        el = max(time.perf_counter() - self.start, 1e-9)
        rate = self.done / el
        msg = f"{self.what}: {self.done}" + (f"/{self.total}" if self.total else "") + f" ({rate:.1f}/s"
        if self.docs:
            msg += f", {self.docs / el:,.0f} docs/s"
        if self.tokens:
            msg += f", {self.tokens / el:,.0f} tokens/s"
        if self.total and rate > 0:
            msg += f", ETA {max(self.total - self.done, 0) / rate:.0f}s"
        elif self.total_bytes and self.bytes:
            # input size is known up front, the number of records is not: extrapolate from bytes
            msg += f", {100 * self.bytes / self.total_bytes:.0f}%, ETA {el * (self.total_bytes / self.bytes - 1):.0f}s"
        return msg + ")"

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
