"""Entity-level NER scores exactly as CoNLL's ``conlleval`` (version 2004-01-26) computes them.

This is a line-by-line port of the perl script's state machine, not a re-derivation, because the
published numbers of the paper come from that script and its treatment of ill-formed IOB matters:

* a chunk starts at ``B-``, at ``I-`` after ``O``, and at any tag whose type differs from the previous
  tag's type (so ``I-X`` after ``I-Y`` starts a new chunk);
* a chunk is counted correct only if gold and guess start together, end together and share the type;
* the type is everything after the *first* hyphen (``B-Amino-acid`` has type ``Amino-acid``); a tag
  without a hyphen (``B``, ``I``) has the empty type, as in the script;
* sentence boundaries (blank lines, or a first field ``-X-``) are ``O O`` for chunking and are not
  counted as tokens;
* precision, recall and F1 are percentages; a type with no guesses has precision 0.

Input lines are split on runs of white space (the script splits on single spaces; for
single-space-separated files, the format it documents, the two agree).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from bio_megatron.utils.errors import DataError

BOUNDARY = "-X-"
_TAG_RE = re.compile(r"^([^-]*)-(.*)$", re.DOTALL)


def split_tag(tag: str) -> tuple[str, str]:
    """``B-Chemical`` -> (``B``, ``Chemical``) as conlleval splits it (prefix before the first hyphen)."""
    m = _TAG_RE.match(tag)
    prefix, ctype = (m.group(1), m.group(2)) if m else (tag, "")
    # perl's `$type ? $type : ""` also maps the string "0" to "": keep the quirk for exact equality.
    return prefix, ("" if ctype == "0" else ctype)


def end_of_chunk(prev_tag: str, tag: str, prev_type: str, ctype: str) -> bool:
    """Did a chunk end between the previous and the current token (conlleval's ``endOfChunk``)."""
    if (prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"),
                           ("E", "E"), ("E", "I"), ("E", "O")}:
        return True
    if prev_tag not in ("O", ".") and prev_type != ctype:
        return True
    return prev_tag in ("]", "[")


def start_of_chunk(prev_tag: str, tag: str, prev_type: str, ctype: str) -> bool:
    """Did a chunk start between the previous and the current token (conlleval's ``startOfChunk``)."""
    if (prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"),
                           ("E", "E"), ("E", "I"), ("O", "E")}:
        return True
    if tag not in ("O", ".") and prev_type != ctype:
        return True
    return tag in ("[", "]")


def chunks(words: Sequence[str], tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, start, end-exclusive) chunks of one sentence under the rules above."""
    out, cur = [], None
    prev_tag, prev_type = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        t, ty = split_tag(tag)
        if cur is not None and end_of_chunk(prev_tag, t, prev_type, ty):
            out.append((cur[0], cur[1], i))
            cur = None
        if i < len(tags) and start_of_chunk(prev_tag, t, prev_type, ty):
            cur = (ty, i)
        prev_tag, prev_type = t, ty
    return out


@dataclass
class ChunkCounts:
    """The counters conlleval keeps; ``report()`` turns them into percentages."""

    found_correct: int = 0   # chunks in the gold annotation
    found_guessed: int = 0   # chunks in the prediction
    correct_chunks: int = 0  # chunks matching in start, end and type
    correct_tags: int = 0    # tokens whose full tag matches
    tokens: int = 0
    per_type_correct: Counter = field(default_factory=Counter)
    per_type_found_correct: Counter = field(default_factory=Counter)
    per_type_found_guessed: Counter = field(default_factory=Counter)

    # streaming state
    _in_correct: bool = False
    _last_correct: str = "O"
    _last_correct_type: str = ""
    _last_guessed: str = "O"
    _last_guessed_type: str = ""

    def add(self, first_item: str, gold_tag: str, pred_tag: str) -> None:
        """Feed one line (first field, gold tag, guessed tag); a boundary is ``("-X-", "O", "O")``."""
        correct, correct_type = split_tag(gold_tag)
        guessed, guessed_type = split_tag(pred_tag)
        if first_item == BOUNDARY:
            guessed = "O"
        lc, lct, lg, lgt = self._last_correct, self._last_correct_type, self._last_guessed, self._last_guessed_type
        gold_end = end_of_chunk(lc, correct, lct, correct_type)
        pred_end = end_of_chunk(lg, guessed, lgt, guessed_type)
        if self._in_correct:
            if gold_end and pred_end and lgt == lct:
                self._in_correct = False
                self.correct_chunks += 1
                self.per_type_correct[lct] += 1
            elif gold_end != pred_end or guessed_type != correct_type:
                self._in_correct = False
        gold_start = start_of_chunk(lc, correct, lct, correct_type)
        pred_start = start_of_chunk(lg, guessed, lgt, guessed_type)
        if gold_start and pred_start and guessed_type == correct_type:
            self._in_correct = True
        if gold_start:
            self.found_correct += 1
            self.per_type_found_correct[correct_type] += 1
        if pred_start:
            self.found_guessed += 1
            self.per_type_found_guessed[guessed_type] += 1
        if first_item != BOUNDARY:
            if correct == guessed and guessed_type == correct_type:
                self.correct_tags += 1
            self.tokens += 1
        self._last_correct, self._last_correct_type = correct, correct_type
        self._last_guessed, self._last_guessed_type = guessed, guessed_type

    def finish(self) -> None:
        """Close a chunk still open at end of input (the script does this after its loop)."""
        if self._in_correct:
            self.correct_chunks += 1
            self.per_type_correct[self._last_correct_type] += 1
            self._in_correct = False


def _prf(correct: int, guessed: int, gold: int) -> tuple[float, float, float]:
    precision = 100.0 * correct / guessed if guessed > 0 else 0.0
    recall = 100.0 * correct / gold if gold > 0 else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def report(counts: ChunkCounts) -> dict:
    """conlleval's summary as a dict: overall and per-type precision/recall/F1 (percent) plus the counts."""
    p, r, f = _prf(counts.correct_chunks, counts.found_guessed, counts.found_correct)
    per_type = {}
    for t in sorted(set(counts.per_type_found_correct) | set(counts.per_type_found_guessed)):
        tp, tr, tf = _prf(counts.per_type_correct[t], counts.per_type_found_guessed[t],
                          counts.per_type_found_correct[t])
        per_type[t] = {"precision": tp, "recall": tr, "f1": tf,
                       "found_correct": counts.per_type_found_correct[t],
                       "found_guessed": counts.per_type_found_guessed[t],
                       "correct": counts.per_type_correct[t]}
    return {
        "precision": p, "recall": r, "f1": f,
        "accuracy": 100.0 * counts.correct_tags / counts.tokens if counts.tokens else 0.0,
        "tokens": counts.tokens, "found_correct": counts.found_correct,
        "found_guessed": counts.found_guessed, "correct": counts.correct_chunks,
        "per_type": per_type,
    }


def evaluate_lines(lines: Iterable[str], path: str | None = None) -> dict:
    """Score conlleval-format lines (``token ... gold pred``; blank line or ``-X-`` between sentences)."""
    counts = ChunkCounts()
    n_features = -1
    for lineno, raw in enumerate(lines, 1):
        features = raw.split()
        if n_features < 0:
            n_features = len(features) - 1  # like the script: the first line, even an empty one, sets it
        elif len(features) - 1 != n_features and features:
            raise DataError(f"unexpected number of fields: {len(features)} (earlier lines have "
                            f"{n_features + 1}); expected 'token gold pred'", path, lineno)
        if not features or features[0] == BOUNDARY:
            features = [BOUNDARY, "O", "O"]
        if len(features) < 2:
            raise DataError(f"need at least a gold and a predicted tag, got {raw.rstrip()!r}", path, lineno)
        # with exactly two fields the script's first item is the gold tag itself
        counts.add(features[0], features[-2], features[-1])
    counts.finish()
    return report(counts)


def evaluate_file(path: str | Path) -> dict:
    """Score a conlleval-format file; see :func:`evaluate_lines`."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found (expected conlleval format: 'token gold pred' per line)", str(path))
    with open(path, encoding="utf-8") as fh:
        return evaluate_lines(fh, str(path))


def evaluate_sequences(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Score per-sentence tag sequences (one word-level tag per word), as conlleval would on their file.

    This is what fine-tuning calls with the word-level predictions; sentences are separated by a
    boundary exactly as blank lines separate them in a conlleval file.
    """
    if len(gold) != len(pred):
        raise DataError(f"{len(gold)} gold sentences but {len(pred)} predicted sentences")
    counts = ChunkCounts()
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise DataError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted tags")
        for gt, pt in zip(g, p):
            counts.add("w", gt, pt)
        counts.add(BOUNDARY, "O", "O")
    counts.finish()
    return report(counts)


def format_conlleval(tokens: Sequence[Sequence[str]], gold: Sequence[Sequence[str]],
                     pred: Sequence[Sequence[str]]) -> str:
    """Write sentences in conlleval's input format (``token gold pred``, blank line between sentences)."""
    out = []
    for ws, gs, ps in zip(tokens, gold, pred):
        out.extend(f"{w} {g} {p}" for w, g, p in zip(ws, gs, ps))
        out.append("")
    return "\n".join(out) + ("\n" if out else "")
