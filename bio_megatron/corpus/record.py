"""What ``data tokenize`` wrote, recorded beside it: ``<prefix>.bio_megatron.json``.

The record serves three checks that megatron's ``.bin/.idx`` cannot answer by themselves:

* **Ownership**: a later ``data tokenize`` replaces ``<prefix>.bin/.idx`` only when the record says we wrote
  exactly these files (sizes and the ``.idx`` checksum); a user's files of the same name are refused unless
  ``--overwrite``. The shard folder's ``manifest.json`` plays the same role for ``<prefix>.shards/``.
* **Vocabulary**: the record holds the vocabulary's content hash (:func:`vocab_fingerprint`: sha256 of the
  ``vocab.txt``, of ``vocab.json`` + ``merges.txt``, or of a SentencePiece ``.model``), kind and casing.
  Pretraining compares it with ``model.tokenizer.vocab_file``: the same size but permuted vocabulary passes every
  id-range check and trains on garbage, so only the content hash catches it (:func:`check_data_vocab`).
* Data without a record (tokenized before records existed, or by Megatron-LM's ``preprocess_data.py``) is
  still accepted, with a warning that nothing could be checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from bio_megatron import __version__
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
COMMAND = "data tokenize"
RECORD_SUFFIX = ".bio_megatron.json"
SKIP_KEY = "model.data.skip_vocab_check"


def record_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}{RECORD_SUFFIX}")


def file_sha256(path: str | os.PathLike, h: Any = None) -> str:
    """sha256 of a file's bytes, streamed (``h``: an existing hash object to continue)."""
    h = h or hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def vocab_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "kind", "sha256", "bytes"}`` of a vocabulary: a WordPiece ``vocab.txt`` (its bytes), or a
    byte-level BPE folder / ``vocab.json`` (the bytes of ``vocab.json`` then ``merges.txt``) or a BPE
    ``tokenizer.json`` (ModernBERT's one file, its bytes; kind ``bpe`` too), or an ALBERT
    SentencePiece ``.model`` (kind ``sentencepiece``, the file's bytes). Built-in names
    (``bert-base-cased``) resolve to the bundled file. Two vocabularies are the same iff the sha256 agree.

    Shared with the checkpoint side, which records the same fingerprint in a checkpoint."""
    from bio_megatron.vocab.bpe import bpe_files
    from bio_megatron.vocab.builtin import resolve_vocab

    from bio_megatron.vocab.sentencepiece import spiece_file

    from bio_megatron.vocab.tokenizer_json import TOKENIZER_JSON, is_bpe_tokenizer_json

    p = resolve_vocab(path)
    files = bpe_files(p)
    if files is None and is_bpe_tokenizer_json(p):  # ModernBERT's one-file BPE: its bytes are the vocabulary
        files = (p / TOKENIZER_JSON if p.is_dir() else p,)
    spiece = spiece_file(p) if files is None else None  # ALBERT's spiece.model: the .model file's bytes
    parts = list(files) if files is not None else [spiece or p]
    kind = "bpe" if files is not None else "sentencepiece" if spiece is not None else "wordpiece"
    h = hashlib.sha256()
    for f in parts:
        file_sha256(f, h)
    return {"path": str(Path(parts[0]).resolve()), "kind": kind,
            "sha256": h.hexdigest(), "bytes": sum(Path(f).stat().st_size for f in parts)}


def write_record(prefix: Path, vocab: dict[str, Any], lowercase: bool, summary: dict[str, Any]) -> None:
    """Write the record of ``<prefix>.bin/.idx`` just written (atomically: temporary name, then rename)."""
    rec = {"command": COMMAND, "version": __version__,
           "vocab": {**vocab, "lowercase": lowercase, "vocab_size": summary["vocab_size"]},
           "bin": {"bytes": os.path.getsize(f"{prefix}.bin")},
           "idx": {"bytes": os.path.getsize(f"{prefix}.idx"), "sha256": file_sha256(f"{prefix}.idx")},
           **{k: summary[k] for k in ("documents", "sentences", "tokens", "unknown_rate")}}
    target = record_path(prefix)
    tmp = Path(f"{target}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def read_record(prefix: str | os.PathLike) -> dict[str, Any] | None:
    """The record of ``prefix``, or None when there is none (or it is not one of ours)."""
    try:
        rec = json.loads(record_path(prefix).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("command") == COMMAND else None


def output_is_ours(prefix: Path) -> bool:
    """True when ``<prefix>.bin/.idx`` are exactly the files our record describes (sizes, ``.idx`` sha256)."""
    rec = read_record(prefix)
    if rec is None:
        return False
    try:
        return (os.path.getsize(f"{prefix}.bin") == rec["bin"]["bytes"]
                and os.path.getsize(f"{prefix}.idx") == rec["idx"]["bytes"]
                and file_sha256(f"{prefix}.idx") == rec["idx"]["sha256"])
    except (OSError, KeyError, TypeError):
        return False


def check_output_owned(prefix: Path, overwrite: bool) -> None:
    """Refuse to replace a ``<prefix>.bin`` / ``.idx`` that we did not write, unless ``overwrite``."""
    from bio_megatron.utils.errors import OutputError

    present = [f"{prefix}{e}" for e in (".bin", ".idx") if os.path.lexists(f"{prefix}{e}")]
    if not present or overwrite or output_is_ours(prefix):
        return
    raise OutputError(f"{present[0]}: exists and was not written by `bio-megatron {COMMAND}` (no matching "
                      f"{record_path(prefix).name}); refusing to replace it: choose another --output-prefix, "
                      "or pass --overwrite to replace it")


def check_data_vocab(prefix: str, tokenizer: Any, vocab_file: str, skip: bool = False) -> None:
    """Refuse pretraining data tokenized with another vocabulary (content hash) or casing than ``vocab_file``;
    data without a record loads with a warning."""
    rec = read_record(prefix)
    if rec is None or not isinstance(rec.get("vocab"), dict):
        log.warning("%s: no record of the vocabulary it was tokenized with (%s missing: tokenized before "
                    "records, or by Megatron-LM's preprocess_data.py); cannot check it matches "
                    "model.tokenizer.vocab_file=%s", prefix, record_path(prefix).name, vocab_file)
        return
    if skip:
        log.warning("%s: vocabulary check skipped (%s=true)", prefix, SKIP_KEY)
        return
    want, have = rec["vocab"], vocab_fingerprint(vocab_file)
    fix = (f"re-tokenize with `bio-megatron data tokenize --vocab {vocab_file}`, or set {SKIP_KEY}=true "
           "if you know the ids agree")
    if want.get("sha256") != have["sha256"]:
        raise DataError(f"tokenized with vocabulary {want.get('path')} (sha256 {str(want.get('sha256'))[:16]}, "
                        f"{want.get('bytes')} bytes) but model.tokenizer.vocab_file is {have['path']} (sha256 "
                        f"{have['sha256'][:16]}, {have['bytes']} bytes): {fix}", str(record_path(prefix)))
    lower = getattr(tokenizer, "lowercase", None)
    if "lowercase" in want and lower is not None and bool(want["lowercase"]) != bool(lower):
        raise DataError(f"tokenized with lower_case={want['lowercase']} but the pretraining tokenizer has "
                        f"lower_case={lower} (model.tokenizer.do_lower_case): {fix}", str(record_path(prefix)))
