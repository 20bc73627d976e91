"""The i2b2/VA 2010 concept release (``model.dataset.format: i2b2_2010`` of ``finetune ner``) and the splits of
every i2b2-style release this package reads (2010, 2012, 2014; ShARe/CLEFE in :mod:`share_clefe`).

2010 (Uzuner et al. 2011; the release's ``README`` and annotation guidelines): a document is ``txt/<id>.txt``, one
sentence a line, tokens separated by white space; its concepts are ``concept/<id>.con`` (``concepts/`` in the test
reference standard), one a line::

    c="<concept text, lower-cased>" L:T L:T||t="problem|test|treatment"

``L`` is the 1-based line and ``T`` the 0-based token of the first and the last token. Where a line of the text
starts with a space, the offsets count the empty token before it (bio-lm's ``p_modifier``: the tokens are one
place further right). A single-line concept's text must equal its tokens' (lower-cased; a mismatch means the
files do not belong together); a concept over a line end is ``B-`` then ``I-`` (:mod:`clinical_spans`).

Splits: ``train_file`` / ``dev_file`` / ``test_file`` name a folder under ``data_dir`` holding ``txt/`` and
``concept/`` (read whole; the test reference standard ``reference_standard_for_test_data``, whose ``concepts/`` go
with the texts of ``test_data/`` beside it, is read as the release has it), or ``train`` / ``dev``: bio-lm's
patient-level 90/10 split of the training release's ``beth`` and ``partners`` (each i2b2 2010 document is one
patient's record; partners drawn first, then beth, from one ``RandomState(1)``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np

from bio_megatron.corpus.iob import Sentence
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.clinical_spans import Mention, SpanStats, label_text, patient_split, resolve_overlaps
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

CON_LINE = 'c="<text>" L:T L:T||t="<type>"'
_CON = re.compile(r'^c="(.*)" (\d+):(\d+) (\d+):(\d+)\|\|t="([^"]+)"$')
_WORD = re.compile(r"\S+")
TRAIN_2010 = "concept_assertion_relation_training_data"
RELEASE_2010 = {"train": [f"{TRAIN_2010}/partners", f"{TRAIN_2010}/beth"], "test": "reference_standard_for_test_data"}
TEST_TEXTS_2010 = "test_data"  # the test release's texts, beside its reference standard


class Positions:
    """``L:T L:T`` token positions of a text -> character offsets (``[start, end)``), each checked."""

    def __init__(self, text: str):
        self.text, self.lines = text, text.split("\n")
        self.starts = np.cumsum([0] + [len(line) + 1 for line in self.lines]).tolist()

    def span(self, concept: str, l1: int, t1: int, l2: int, t2: int, path: Path, lineno: int) -> tuple[int, int]:
        ends = []
        for line_no, tok in ((l1, t1), (l2, t2)):
            if not 1 <= line_no <= len(self.lines):
                raise DataError(f"line {line_no} of {line_no}:{tok} is outside the text ({len(self.lines)} lines)",
                                str(path), lineno)
            line = self.lines[line_no - 1]
            words = [w.span() for w in _WORD.finditer(line)]
            index = tok - 1 if line[:1].isspace() else tok
            if not 0 <= index < len(words):
                raise DataError(f"token {tok} of {line_no}:{tok} is outside the line ({len(words)} tokens)",
                                str(path), lineno)
            ends.append(self.starts[line_no - 1] + words[index][0 if not ends else 1])
        start, end = ends
        if end <= start:
            raise DataError(f"concept ends ({l2}:{t2}) before it starts ({l1}:{t1})", str(path), lineno)
        found = self.text[start:end]
        if l1 == l2 and " ".join(found.split()).lower() != " ".join(concept.split()).lower():
            raise DataError(f"concept text {concept!r} is not the text at {l1}:{t1}-{l2}:{t2} ({found!r}): the "
                            f"annotation file does not belong to its .txt", str(path), lineno)
        return start, end


def read_con(path: Path, text: str, allowed: set[str] | None = None) -> list[Mention]:
    """The concepts of one ``.con`` file as character offsets into ``text`` (its ``.txt``), each checked."""
    positions, out = Positions(text), []
    for lineno, raw in iter_lines(path, f"i2b2 2010 concept lines {CON_LINE}"):
        if not raw.strip():
            continue
        m = _CON.match(raw.strip())
        if not m:
            raise DataError(f"does not parse as a concept line {CON_LINE}: {raw.strip()[:80]!r}", str(path), lineno)
        concept, l1, t1, l2, t2, ctype = m.group(1), *map(int, m.group(2, 3, 4, 5)), m.group(6)
        if allowed is not None and f"B-{ctype}" not in allowed:
            raise DataError(f"concept type {ctype!r} is not in the label set {sorted(allowed)}", str(path), lineno)
        start, end = positions.span(concept, l1, t1, l2, t2, path, lineno)
        out.append(Mention(start, end, ctype, str(path), lineno))
    return out


def _text(path: Path) -> str:
    return "\n".join(line for _, line in iter_lines(path, "i2b2 text, one sentence a line"))


def read_2010_documents(txt_dir: Path, con_dir: Path, allowed: set[str] | None,
                        stats: SpanStats) -> dict[str, list[Sentence]]:
    """``{document id: sentences}`` of a ``txt/`` and a ``concept/`` folder (every .txt needs its .con)."""
    for d in (txt_dir, con_dir):
        if not d.is_dir():
            raise DataError("folder not found (an i2b2 2010 split holds txt/ and concept/)", str(d))
    texts = {p.stem: p for p in txt_dir.glob("*.txt")}
    cons = {p.stem: p for p in con_dir.glob("*.con")}
    if not texts:
        raise DataError("no .txt documents in this folder", str(txt_dir))
    if set(texts) != set(cons):
        missing = sorted(set(texts) ^ set(cons))[:3]
        raise DataError(f"documents and concept files do not pair up (e.g. {missing}): every <id>.txt needs "
                        f"{con_dir.name}/<id>.con", str(con_dir))
    docs = {}
    for doc_id in sorted(texts):
        text = _text(texts[doc_id])
        mentions = resolve_overlaps(read_con(cons[doc_id], text, allowed), stats)
        docs[doc_id] = label_text(text, mentions, stats)
    return docs


def _split_dirs(folder: Path) -> tuple[Path, Path]:
    """``(txt, concept)`` folders of a split folder (``concepts/`` and ``../test_data`` for the test release)."""
    con = folder / "concepts" if (folder / "concepts").is_dir() and not (folder / "concept").is_dir() \
        else folder / "concept"
    txt = folder / "txt"
    if not txt.is_dir() and (folder.parent / TEST_TEXTS_2010).is_dir():
        txt = folder.parent / TEST_TEXTS_2010
    return txt, con


def read_i2b2_2010(data_dir: str | Path, name: str, labels: Iterable[str] | None = None,
                   stats: SpanStats | None = None) -> list[Sentence]:
    """Sentences of one split (see the module docstring): ``train``/``dev`` of the release, or a folder."""
    root, allowed, stats = Path(data_dir), set(labels) if labels is not None else None, stats or SpanStats()
    if name in ("train", "dev"):
        rng, chosen, docs = np.random.RandomState(1), [], {}  # one stream: partners first, then beth (bio-lm)
        for source in RELEASE_2010["train"]:
            part = read_2010_documents(root / source / "txt", root / source / "concept", allowed, stats)
            train, dev = patient_split(part, rng)
            chosen += [f"{source}/{d}" for d in (train if name == "train" else dev)]
            docs.update({f"{source}/{d}": s for d, s in part.items()})
    else:
        docs = read_2010_documents(*_split_dirs(root / name), allowed, stats)
        chosen = sorted(docs)
    return chosen_sentences("i2b2 2010", name, docs, chosen, stats)


def chosen_sentences(what: str, name: str, docs: dict[str, list[Sentence]], chosen: list[str],
                     stats: SpanStats) -> list[Sentence]:
    """The chosen documents' sentences, in order, with one log line of counts."""
    out = [s for d in chosen for s in docs[d]]
    stats.split_documents = len(chosen)
    mentions = sum(t == "B" or t.startswith("B-") for s in out for t in s.tags)
    log.info("%s %s: %d documents, %d sentences, %d mentions (of all documents read: %d overlapping dropped, "
             "%d duplicates)", what, name, len(chosen), len(out), mentions, stats.overlapping_dropped, stats.duplicates)
    return out
