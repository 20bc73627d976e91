"""IOB files (``token<TAB>tag`` a line, a blank line between sentences): the one reader and writer.

NER fine-tuning (:mod:`bio_megatron.tasks.ner_data`, which re-exports both), the label-bias analysis and the
vocabulary statistics (:mod:`bio_megatron.vocab.stats`) read the same files; they live at this layer so that
each of them can import it without an upward arrow. CoNLL's ``-DOCSTART-`` lines end a sentence and are
skipped; every problem is a :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open

_TAG_RE = re.compile(r"^(O|[BIES](-\S+)?)$")
DOCSTART = "-DOCSTART-"


@dataclass
class Sentence:
    """One sentence: words and their word-level tags (same length)."""

    words: list[str]
    tags: list[str]


def check_tag(tag: str, path: str | None, line: int | None, labels: set[str] | None) -> None:
    """``tag`` is one of ``labels`` when given, else IOB/IOBES-shaped (``O``, ``B-<type>``, ``I-<type>``, ...)."""
    if labels is not None:
        if tag not in labels:
            raise DataError(f"unknown tag {tag!r}; known tags: {sorted(labels)}", path, line)
    elif not _TAG_RE.match(tag):
        raise DataError(f"unknown tag {tag!r}; expected O, B-<type> or I-<type> (IOB2)", path, line)


def read_iob(path: str | Path, labels: Iterable[str] | None = None) -> list[Sentence]:
    """Sentences of an IOB file: ``token<TAB>tag`` per line, blank line (or ``-DOCSTART-``) between sentences.

    ``labels`` restricts the allowed tags (e.g. a saved label map); otherwise any IOB/IOBES-shaped tag is
    accepted. Bytes that are not UTF-8, wrong field counts and unknown tags raise :class:`DataError` with the
    line number. An empty file gives no sentences (callers that need some say so, naming the file).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("IOB file not found (expected 'token<TAB>tag' lines)", str(path))
    allowed = set(labels) if labels is not None else None
    sentences, words, tags = [], [], []
    with open(path, "rb") as fh:  # decoded per line, so that a bad byte is reported with its line
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DataError(f"not UTF-8 ({exc.reason} at byte {exc.start} of the line)", str(path),
                                lineno) from None
            if not line.strip() or line.startswith(DOCSTART):
                if words:
                    sentences.append(Sentence(words, tags))
                words, tags = [], []
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0]:
                raise DataError(f"expected 'token<TAB>tag', got {len(fields)} tab-separated field(s): {line!r}",
                                str(path), lineno)
            check_tag(fields[1], str(path), lineno, allowed)
            words.append(fields[0])
            tags.append(fields[1])
    if words:
        sentences.append(Sentence(words, tags))
    return sentences


def write_iob(path: str | Path, sentences: Sequence[Sentence]) -> None:
    """Write sentences as ``token<TAB>tag`` lines with a blank line after each sentence (atomically)."""
    with atomic_open(path, "w", encoding="utf-8") as fh:
        for s in sentences:
            fh.writelines(f"{w}\t{t}\n" for w, t in zip(s.words, s.tags))
            fh.write("\n")
