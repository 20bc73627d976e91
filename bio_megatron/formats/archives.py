"""Archives from outside (zip: torch's ``.pt``/``.bin``/``.ckpt`` format and Megatron-LM ``.zip`` folders; tar:
``.nemo``) read with limits, so that a crafted one (a "zip bomb": a member that inflates to gigabytes, a tar member
declaring a huge size, millions of members) is refused in seconds with bounded memory and disk.

What is checked, before any member is inflated, unpickled or written:

- the **member count** (zip: from the end-of-central-directory record, before ``zipfile`` parses the directory
  into memory; tar: while the headers are read) against :data:`MAX_MEMBERS`;
- each member's **declared size** and their total against a byte bound: the one the caller derives from the
  model's shape (:func:`shape_bound`) when it knows it, else :data:`DEFAULT_LIMIT`; the environment variable
  ``BIO_MEGATRON_ARCHIVE_LIMIT`` (bytes, or with a K/M/G/T suffix) overrides either, for models larger than
  the estimate;
- zip members' **compression ratio**: weights do not compress (torch stores them uncompressed; deflate gains
  ~8% on float tensors), so a large member that inflates more than :data:`MAX_RATIO` times is a bomb, whatever
  size it declares.

The **actual** sizes are bounded too: zip members are streamed through :func:`copy_member` in 1 MiB chunks with a
running count (Python's ``zipfile`` also stops at the declared size and checks the CRC); tar members are copied
exactly as long as their checked header says. Nothing is read into memory whole.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

from bio_megatron.utils.errors import CheckpointError

ENV_LIMIT = "BIO_MEGATRON_ARCHIVE_LIMIT"
DEFAULT_LIMIT = 64 << 30     # no shape known: larger than a 1.2b checkpoint with its fp32 Adam state (~20 GB)
MAX_MEMBERS = 20_000         # a torch file holds one record per tensor; a NeMo archive a few files per rank
MAX_RATIO = 100              # inflated / compressed, for members larger than RATIO_FLOOR
RATIO_FLOOR = 1 << 20        # small text members (configs, vocabularies) may compress well
CHUNK = 1 << 20
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _human(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def archive_limit(derived: int | None = None) -> int:
    """The byte bound for one archive: ``$BIO_MEGATRON_ARCHIVE_LIMIT`` when set, else ``derived`` (from the
    model's shape), else :data:`DEFAULT_LIMIT`."""
    raw = os.environ.get(ENV_LIMIT, "").strip()
    if not raw:
        return derived if derived is not None else DEFAULT_LIMIT
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:i?B)?", raw, re.IGNORECASE)
    if m is None or int(m.group(1)) <= 0:
        raise CheckpointError(f"{ENV_LIMIT}={raw!r}: expected a positive number of bytes, e.g. 80G")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def shape_bound(hidden: int, layers: int, ffn: int | None = None, vocab: int | None = None,
                positions: int = 4096, bytes_per_param: int = 4, copies: int = 1) -> int:
    """Bytes a BERT encoder of this shape can take: its parameters (attention, FFN, LayerNorms, embeddings, MLM and
    NSP heads) x ``bytes_per_param`` x ``copies`` (e.g. 3 for fp32 weights with Adam's two moments), plus 25% and
    64 MiB for what a file adds (pickled args, RNG states, vocabularies, records' padding). Without ``vocab``
    a vocabulary of 2^20 entries is assumed (larger than any BERT's)."""
    ffn = ffn or 4 * hidden
    per_layer = 4 * hidden * hidden + 2 * hidden * ffn + 9 * hidden + ffn
    embeddings = ((vocab or 1 << 20) + positions + 4) * hidden
    params = layers * per_layer + embeddings + hidden * hidden + 6 * hidden + (vocab or 1 << 20)
    return int(params * bytes_per_param * copies * 1.25) + (64 << 20)


def _zip_entries(fp: BinaryIO, where: str) -> int:
    """Total entries that the end-of-central-directory record (or its ZIP64 form) declares, read from the last
    64 KiB of the file: cheap, and before ``zipfile`` builds a ZipInfo per entry."""
    fp.seek(0, os.SEEK_END)
    size = fp.tell()
    fp.seek(max(0, size - (1 << 16) - 22))
    tail = fp.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        raise CheckpointError(f"{where}: damaged or truncated zip archive (no end of central directory)")
    entries = struct.unpack("<H", tail[at + 10: at + 12])[0]
    if entries == 0xFFFF and at >= 20 and tail[at - 20: at - 16] == b"PK\x06\x07":  # ZIP64 locator
        fp.seek(struct.unpack("<Q", tail[at - 12: at - 4])[0])
        record = fp.read(56)
        if len(record) < 40 or record[:4] != b"PK\x06\x06":
            raise CheckpointError(f"{where}: damaged zip archive (ZIP64 end record not found)")
        entries = struct.unpack("<Q", record[32:40])[0]
    return entries


def check_zip(source: str | Path | BinaryIO, where: str, limit: int | None = None) -> list[zipfile.ZipInfo]:
    """The members of a zip file after the checks in the module docstring (CheckpointError naming ``where``, the
    member and the bound otherwise)."""
    bound = "what this model's shape can take" if limit is not None and not os.environ.get(ENV_LIMIT) else "the cap"
    limit = archive_limit(limit)
    own = isinstance(source, (str, Path))
    fp = open(source, "rb") if own else source
    try:
        start = fp.tell()
        entries = _zip_entries(fp, where)
        if entries > MAX_MEMBERS:
            raise CheckpointError(f"{where}: the zip declares {entries} members, more than {MAX_MEMBERS}; refusing "
                                  "it (a crafted archive?)")
        fp.seek(start)
        try:
            with zipfile.ZipFile(fp) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise CheckpointError(f"{where}: damaged zip archive ({exc})") from None
    finally:
        if own:
            fp.close()
        else:
            fp.seek(0)
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > limit or total > limit:
            what = f"member {info.filename!r} declares" if info.file_size > limit else "its members declare"
            size = info.file_size if info.file_size > limit else total
            raise CheckpointError(f"{where}: {what} {_human(size)} unpacked, more than {bound} ({_human(limit)}); "
                                  f"refusing it (a zip bomb? set {ENV_LIMIT} to raise the bound)")
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise CheckpointError(f"{where}: member {info.filename!r} inflates {info.compress_size} bytes to "
                                  f"{_human(info.file_size)} (more than {MAX_RATIO}x; model weights do not compress "
                                  "so): refusing it as a zip bomb")
    return infos


def check_zip_if_zip(source: str | Path | BinaryIO, where: str, limit: int | None = None) -> None:
    """:func:`check_zip` for a torch file in the zip format; the legacy (non-zip) pickle format passes through."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fp:
            magic = fp.read(4)
    else:
        magic = source.read(4)
        source.seek(0)
    if magic == b"PK\x03\x04":
        check_zip(source, where, limit)


def copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: BinaryIO, where: str, limit: int) -> int:
    """Stream one checked member into ``dest`` in :data:`CHUNK` pieces, never past its declared size nor
    ``limit``; returns the bytes written."""
    written = 0
    try:
        with zf.open(info) as member:
            while chunk := member.read(CHUNK):
                written += len(chunk)
                if written > min(info.file_size, limit):
                    raise CheckpointError(f"{where}: member {info.filename!r} inflates past its declared "
                                          f"{_human(info.file_size)}; refusing it (a crafted archive?)")
                dest.write(chunk)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:  # CRC mismatch, truncation
        raise CheckpointError(f"{where}: damaged member {info.filename!r} ({exc})") from None
    return written
