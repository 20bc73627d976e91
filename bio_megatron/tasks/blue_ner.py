"""BLUE's 4-column NER files (``model.dataset.format: blue`` of ``finetune ner``), as bio-lm reads BC5CDR.

BLUE's converter (``blue/ext/preprocessing.py``, ncbi-nlp/BLUE_Benchmark) writes one token a line with Python's
``csv`` writer, tab-delimited::

    token<TAB>document id<TAB>character offset<TAB>label

a blank line after each sentence. The document id (the PMID) is written on a sentence's first token only, ``-``
on the others; the offset is the token's start in the document (title + " " + abstract); labels are untyped
``B``/``I``/``O`` (one entity type per file: BC5CDR-chem, BC5CDR-disease). Because the writer is ``csv``, a
token holding a double quote is quoted (a lone double quote is written as four of them): lines are read back with ``csv``
so the token is the original one.

Checked, each a :class:`DataError` naming the file and line: four fields; an integer offset >= 0, increasing
within a sentence; a document id on a sentence's first token; a tag from ``labels`` (a saved label map) or
IOB-shaped. ``-DOCSTART-`` lines are not part of the format and are refused as a token like any other would not be.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable

from bio_megatron.corpus.iob import Sentence, check_tag
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.utils.errors import DataError

EXPECTED = "BLUE NER lines 'token<TAB>document id<TAB>offset<TAB>label', a blank line between sentences"


def read_blue_ner(path: str | Path, labels: Iterable[str] | None = None) -> list[Sentence]:
    """Sentences of a BLUE 4-column NER file (words and tags; document ids and offsets are checked, then dropped)."""
    allowed = set(labels) if labels is not None else None
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    last_offset = -1
    for lineno, line in iter_lines(path, EXPECTED):
        if not line.strip():
            if words:
                sentences.append(Sentence(words, tags))
            words, tags, last_offset = [], [], -1
            continue
        try:
            fields = next(csv.reader([line], delimiter="\t", strict=True))
        except csv.Error as exc:
            raise DataError(f"does not parse as a tab-separated csv row ({exc}); expected {EXPECTED}", str(path),
                            lineno) from None
        if len(fields) != 4:
            raise DataError(f"{len(fields)} tab-separated field(s); expected {EXPECTED}", str(path), lineno)
        token, doc, offset, tag = fields
        if not token or token.isspace():
            raise DataError(f"empty token; expected {EXPECTED}", str(path), lineno)
        if not words and (not doc or doc == "-"):
            raise DataError(f"a sentence's first token has no document id ({doc!r}); expected {EXPECTED}",
                            str(path), lineno)
        if not offset.isdigit():
            raise DataError(f"offset {offset[:20]!r} is not an integer >= 0; expected {EXPECTED}", str(path), lineno)
        if int(offset) <= last_offset:
            raise DataError(f"offset {offset} is not after the previous token's ({last_offset}): tokens out of "
                            f"order or a missing blank line between sentences", str(path), lineno)
        last_offset = int(offset)
        check_tag(tag, str(path), lineno, allowed)
        words.append(token)
        tags.append(tag)
    if words:
        sentences.append(Sentence(words, tags))
    return sentences
