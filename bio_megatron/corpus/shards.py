"""The resumable shard folder of ``data tokenize`` (``<prefix>.shards/``): whose it is, what may be removed,
and whether a finished shard can be trusted on resume.

* A folder is ours when it holds our ``manifest.json``. We only ever remove files with the names we write
  (:data:`OUR_FILE`: the manifest, ``shard-NNNNNN.bin/.idx/.json`` and their ``.tmp-<pid>`` temporaries);
  anything a user put in the folder survives a discard, ``--no-resume`` and ``--overwrite``.
* A folder without our manifest is refused, unless ``--overwrite``: then our shards are written beside the
  user's files (never over one of the same name) and only ours are removed afterwards.
* A shard's ``.json`` (written last, its commit point) records the sizes of its ``.bin/.idx`` and a sha256
  of both; a reused shard must match its record and its own index (sequence, document and token counts),
  else it is redone: a truncated or altered shard never reaches the output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from bio_megatron.corpus.indexed import read_index
from bio_megatron.utils.errors import OutputError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
OUR_FILE = re.compile(r"(manifest\.json|shard-\d{6}\.(bin|idx|json))(\.tmp-\d+)?")


def _manifest_of(work: Path) -> dict[str, Any] | None:
    try:
        m = json.loads((work / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and "vocab_sha256" in m and "shard_lines" in m else None


def _ours(work: Path) -> list[Path]:
    return [p for p in work.iterdir() if OUR_FILE.fullmatch(p.name) and p.is_file() and not p.is_symlink()]


def remove_ours(work: Path, temporaries_only: bool = False) -> None:
    """Remove the files we write in ``work`` (only ``.tmp-*`` ones with ``temporaries_only``); the folder too
    when nothing else is left in it."""
    if not work.is_dir() or work.is_symlink():
        return
    for p in _ours(work):
        if not temporaries_only or ".tmp-" in p.name:
            p.unlink(missing_ok=True)
    try:
        work.rmdir()  # only succeeds when empty: a failed first run leaves no folder behind
    except OSError:
        if not temporaries_only:
            log.info("kept %s: it holds files that data tokenize did not write", work)


def prepare(work: Path, manifest: dict[str, Any], resume: bool, overwrite: bool) -> None:
    """Make ``work`` ready for this run's shards: reuse ours when the manifest matches, discard ours
    otherwise, refuse a folder (or file) we did not write unless ``overwrite``; write the manifest."""
    if os.path.lexists(work) and (work.is_symlink() or not work.is_dir()):
        raise OutputError(f"{work}: exists and is not a folder; data tokenize keeps its resumable shards "
                          "there: move it away or choose another --output-prefix")
    if work.is_dir():
        old = _manifest_of(work)
        if old is None:  # a run killed between making the folder and renaming its manifest left only temporaries
            remove_ours(work, temporaries_only=True)
        if old is None and work.is_dir() and next(work.iterdir(), None) is not None:  # empty: nothing to lose
            clash = [p.name for p in work.iterdir() if OUR_FILE.fullmatch(p.name)]
            if not overwrite:
                raise OutputError(f"{work}: a folder not written by `bio-megatron data tokenize` (no manifest.json "
                                  "of ours); refusing to delete or write into it: choose another --output-prefix, "
                                  "or pass --overwrite to write the shards beside its files (none is removed)")
            if clash:
                raise OutputError(f"{work}: holds {clash[0]}, a file we did not write with a name our shards use; "
                                  "refusing to replace it even with --overwrite: choose another --output-prefix")
            log.warning("%s: not ours (no manifest.json); --overwrite: writing shards beside its files", work)
        elif old is not None and not (resume and old == manifest):
            log.info("discarding our shards in %s: inputs, vocabulary or settings changed (or --no-resume)", work)
            for p in _ours(work):
                p.unlink()
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / f"manifest.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, work / "manifest.json")


def checksum(shard_prefix: str) -> dict[str, Any]:
    """Sizes of a shard's ``.bin/.idx`` and the sha256 of the two, back to back."""
    h = hashlib.sha256()
    sizes = {}
    for ext in (".bin", ".idx"):
        with open(shard_prefix + ext, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
            sizes[ext[1:] + "_bytes"] = fh.tell()
    return {**sizes, "sha256": h.hexdigest()}


def load_verified(shard_prefix: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a finished shard that matches its record, else ``(None, why)``."""
    try:
        rec = json.loads(Path(shard_prefix + ".json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None  # never finished: nothing to report
    except (OSError, ValueError) as exc:
        return None, f"unreadable record ({exc})"
    if not isinstance(rec, dict) or "sha256" not in rec:
        return None, "record without checksums (an older run)"
    try:
        got = checksum(shard_prefix)
        lengths, docs, _ = read_index(shard_prefix + ".idx")
    except Exception as exc:  # a truncated .idx fails inside numpy or struct, with their own error types
        return None, f"unreadable shard ({type(exc).__name__}: {exc})"
    expect = {"bin_bytes": rec.get("bin_bytes"), "idx_bytes": rec.get("idx_bytes"), "sha256": rec["sha256"]}
    if got != expect:
        diff = [k for k in expect if got[k] != expect[k]]
        return None, "differs from its record (" + ", ".join(f"{k} {got[k]} != {expect[k]}" for k in diff) + ")"
    if (len(lengths) != rec.get("sentences") or int(lengths.sum()) != rec.get("tokens")
            or len(docs) - 1 != rec.get("documents") or got["bin_bytes"] != 4 * rec.get("tokens", -1)):
        return None, "index counts disagree with its record"
    return rec, None
