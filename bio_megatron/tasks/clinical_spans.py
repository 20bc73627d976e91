"""Character-offset mentions -> word-level IOB sentences, and the patient-level dev split, for the clinical NER
releases (i2b2 2010/2012/2014, ShARe/CLEFE) read by :mod:`bio_megatron.tasks.i2b2` and
:mod:`bio_megatron.tasks.share_clefe`.

The choices, each bio-lm's (``facebookresearch/bio-lm``, ``preprocessing/preprocess_i2b2_*_ner.py``) unless said:

* A line of the text is a sentence (the i2b2 releases write one sentence a line); words are the runs of
  non-white-space, and a word is cut where a mention starts or ends inside it (bio-lm cuts the characters into
  chunks at label changes: the same words).
* A mention that runs over a line end is ``B-`` on its first line and ``I-`` on the next: the lines stay
  sentences, so the next sentence starts with ``I-`` (what bio-lm trains and scores on).
* A discontiguous mention (ShARe/CLEFE) is one mention per fragment, the later ones ``continues``: ``B`` on the
  first fragment's first word, ``I`` on every other word of every fragment, ``O`` in the gaps (BLUE's
  ``create_clefe_bert.py``). An empty type gives BLUE's untyped ``B``/``I``.
* Overlapping mentions (ours: bio-lm lets the later one overwrite the earlier one's characters, which can leave
  a broken span): the one that starts first is kept, the longer one on a tie; the other is dropped and counted.
  Exact duplicates (same span, same type) are one mention.
* The dev split is by patient: a seeded permutation of the sorted patient ids, the first ``int(N * 0.9)`` to
  train (bio-lm: ``np.random.seed(1)`` for 2010; no seed for 2012/2014, and ids in ``set`` order, so its own split
  cannot be reproduced; sorting first and seeding with 1 makes ours the same on every machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from bio_megatron.corpus.iob import Sentence

_WORD = re.compile(r"\S+")
DEV_FRACTION = 0.1  # bio-lm: dev_set_size=0.1 (2012, 2014), 0.9 * N to train (2010)
SPLIT_SEED = 1      # bio-lm 2010: np.random.seed(1)


@dataclass(frozen=True)
class Mention:
    """One annotated span: ``[start, end)`` character offsets into the document's text, its type, and where the
    annotation was written (file and line) for error messages."""

    start: int
    end: int
    type: str
    source: str = ""
    line: int | None = None
    continues: bool = False
    """A later fragment of a discontiguous mention (ShARe/CLEFE): its words are all ``I``, as BLUE tags them."""


@dataclass
class SpanStats:
    """What labelling a set of documents kept and dropped (printed by ``data convert``, logged by the readers)."""

    documents: int = 0
    sentences: int = 0
    mentions: int = 0
    overlapping_dropped: int = 0
    duplicates: int = 0
    text_mismatches: int = 0
    split_documents: int = 0
    """Documents of the split last chosen (train and dev read the whole training release: the other counts are
    of every document read)."""

    def add(self, other: "SpanStats") -> None:
        for key in vars(self):
            setattr(self, key, getattr(self, key) + getattr(other, key))


def resolve_overlaps(mentions: Iterable[Mention], stats: SpanStats) -> list[Mention]:
    """Mentions sorted by start, without exact duplicates and without overlaps (see the module's rule)."""
    kept: list[Mention] = []
    seen: set[tuple[int, int, str]] = set()
    for m in sorted(mentions, key=lambda m: (m.start, -(m.end - m.start), m.type)):
        key = (m.start, m.end, m.type)
        if key in seen:
            stats.duplicates += 1
            continue
        seen.add(key)
        if kept and m.start < kept[-1].end:
            stats.overlapping_dropped += 1
            continue
        kept.append(m)
    stats.mentions += len(kept)
    return kept


def label_text(text: str, mentions: Sequence[Mention], stats: SpanStats) -> list[Sentence]:
    """IOB sentences of one document: one per non-blank line, mentions (character offsets into ``text``,
    already :func:`resolve_overlaps`'d) as ``B-type`` / ``I-type`` on the words they cover."""
    cuts = sorted({m.start for m in mentions} | {m.end for m in mentions})
    sentences: list[Sentence] = []
    pos = 0
    k = 0  # index of the first mention that may still cover a word at or after pos
    for line in text.split("\n"):
        words, tags = [], []
        for w in _WORD.finditer(line):
            s0, e0 = pos + w.start(), pos + w.end()
            inner = [c for c in _cuts_between(cuts, s0, e0)]
            for s, e in zip([s0] + inner, inner + [e0]):
                while k < len(mentions) and mentions[k].end <= s:
                    k += 1
                tag = "O"
                if k < len(mentions) and mentions[k].start <= s < mentions[k].end:
                    m = mentions[k]
                    # B- only at the mention's first word: a mention that starts on an earlier line goes on with I-
                    first = not m.continues and (s == m.start or not text[m.start:s].strip())
                    tag = ("B" if first else "I") + (f"-{m.type}" if m.type else "")  # BLUE's files: untyped B/I
                words.append(text[s:e])
                tags.append(tag)
        if words:
            sentences.append(Sentence(words, tags))
        pos += len(line) + 1
    stats.documents += 1
    stats.sentences += len(sentences)
    return sentences


def _cuts_between(cuts: Sequence[int], s: int, e: int) -> list[int]:
    import bisect

    return cuts[bisect.bisect_right(cuts, s):bisect.bisect_left(cuts, e)]


def patient_split(patients: Iterable[str], rng: np.random.RandomState,
                  dev_fraction: float = DEV_FRACTION) -> tuple[list[str], list[str]]:
    """(train, dev) patient ids: a permutation of the sorted ids by ``rng``, the first ``int(N * (1 - f))`` train."""
    ids = sorted(set(patients))
    order = [ids[i] for i in rng.permutation(len(ids))]
    n_train = int(len(ids) * (1 - dev_fraction))
    return order[:n_train], order[n_train:]
