"""The JSON-lines document format shared by extraction, vocabulary training and tokenization.

One JSON object per line::

    {"id": "PMID:41576520", "source": "pubmed", "title": "...", "sentences": ["...", "..."]}
    {"id": "PMC1790863", "source": "pmc", "title": "...", "licence": "CC BY", "sentences": [...]}

``id``, ``source`` and ``sentences`` are required; the title is also the first sentence for PubMed so
that tokenization only ever reads ``sentences``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
SOURCES = ("pubmed", "pmc")


@dataclass
class Document:
    id: str
    source: str
    sentences: list[str]
    title: str = ""
    licence: str | None = None
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        if d["licence"] is None:
            d.pop("licence")
        if not d["meta"]:
            d.pop("meta")
        return json.dumps(d, ensure_ascii=False)


def validate_record(obj: object) -> str | None:
    """Why a decoded JSON value is not a valid document, or ``None`` when it is."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    if "sentences" not in obj and isinstance(obj.get("text"), str):
        # The Megatron-LM convention (tools/preprocess_data.py): say how to read it, not just "no id".
        return ("no 'sentences' list; this looks like Megatron-LM {\"text\": ...} JSONL: "
                "read it with --json-keys text")
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        return "missing or empty string field 'id'"
    if obj.get("source") not in SOURCES:
        return f"field 'source' must be one of {SOURCES}, got {obj.get('source')!r}"
    sents = obj.get("sentences")
    if not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
        return "field 'sentences' must be a list of strings"
    return None


@dataclass
class ReadStats:
    documents: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    def skip(self, where: str, why: str, max_listed: int = 20) -> None:
        self.skipped += 1
        # Listed and logged up to a cap: a wrong-schema file of a million lines must not flood the log.
        if len(self.problems) < max_listed:
            self.problems.append(f"{where}: {why}")
            log.warning("skipping record %s: %s", where, why)


def iter_documents(path: str | Path, stats: ReadStats | None = None,
                   strict: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, document)`` from a JSONL file.

    A bad line (not UTF-8, not JSON, wrong schema) is skipped and counted in ``stats``; with
    ``strict=True`` it raises a ``DataError`` naming the file and line instead. A missing or empty
    file is always fatal: a silently empty corpus is worse than a stopped run.
    """
    path = check_input_file(path)  # a FIFO, a symlink loop or an unreadable file is named as what it is
    stats = stats if stats is not None else ReadStats()
    with open(path, "rb") as fh:
        yield from _iter_lines(fh, path, stats, strict)


def _decode_line(raw: bytes) -> tuple[Any, str | None]:
    """One JSONL line as a Python object: ``(object, None)``, or ``(None, why it cannot be read)``."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason} at byte {exc.start} of the line)"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"


def parse_record(raw: bytes) -> tuple[Any, str | None]:
    """Decode and validate one JSONL line: ``(document, None)``, or ``(None, why it is bad)``."""
    obj, why = _decode_line(raw)
    if why is not None:
        return None, why
    why = validate_record(obj)
    return (obj, None) if why is None else (None, why)


def parse_text_record(raw: bytes, json_keys: tuple[str, ...]) -> tuple[list[str] | None, str | None]:
    """Decode one Megatron-LM style line (``{"text": "..."}``): ``(texts of json_keys in order, None)``,
    or ``(None, why it is bad)``. Like Megatron-LM's ``preprocess_data.py``, every key must be present."""
    obj, why = _decode_line(raw)
    if why is not None:
        return None, why
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    missing = [k for k in json_keys if not isinstance(obj.get(k), str)]
    if missing:
        have = ", ".join(repr(k) for k in list(obj)[:6]) or "none"
        return None, f"missing string field(s) {', '.join(map(repr, missing))} asked by --json-keys (keys: {have})"
    return [obj[k] for k in json_keys], None


def _iter_lines(fh: IO[bytes], path: Path, stats: ReadStats, strict: bool) -> Iterator[tuple[int, dict]]:
    for lineno, raw in enumerate(fh, 1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        obj, why = parse_record(raw)
        if why is not None:
            if strict:
                raise DataError(why, str(path), lineno)
            stats.skip(where, why)
            continue
        stats.documents += 1
        yield lineno, obj
