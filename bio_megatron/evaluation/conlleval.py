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
single-space-separated files, the format it documents, the two agree). Unlike the script, input it
would score as nonsense is refused (:func:`evaluate_lines`): fewer than three fields, no token, or a
tag column without any IOB tag.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from bio_megatron.evaluation.inputs import iter_lines
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


EXPECTED = "conlleval format: 'token ... gold pred' per line, blank line between sentences"
# First letters of the tags an IOB/IOBES/BILOU scheme uses: a gold or predicted column with none of these
# is not a tag column (a POS column, or tokens), and scoring it would print zeros that look like a result.
_TAG_PREFIXES = frozenset("OBIESUL")


def _looks_like_tag(tag: str) -> bool:
    return split_tag(tag)[0] in _TAG_PREFIXES


def evaluate_lines(lines: Iterable[str], path: str | None = None) -> dict:
    """Score conlleval-format lines (``token ... gold pred``; blank line or ``-X-`` between sentences).

    Unlike the perl script, a line of fewer than three fields is refused: a ``token<TAB>tag`` file (the
    training format, no prediction column) would otherwise score the tokens as gold tags. So are input
    without any token and input whose gold or predicted column holds no IOB tag at all.
    """
    counts = ChunkCounts()
    n_features = -1
    gold_seen = pred_seen = False
    for lineno, raw in enumerate(lines, 1):
        features = raw.split()
        if n_features < 0:
            n_features = len(features) - 1  # like the script: the first line, even an empty one, sets it
        elif len(features) - 1 != n_features and features:
            raise DataError(f"unexpected number of fields: {len(features)} (earlier lines have "
                            f"{n_features + 1}); expected 'token ... gold pred'", path, lineno)
        if not features or features[0] == BOUNDARY:
            features = [BOUNDARY, "O", "O"]
        elif len(features) < 3:
            raise DataError(f"{len(features)} field(s) {raw.strip()!r}; expected 'token ... gold pred' as "
                            f"conlleval (the last two columns are the gold and the predicted tag; a "
                            f"'token<TAB>tag' file has no prediction column)", path, lineno)
        else:
            gold_seen = gold_seen or _looks_like_tag(features[-2])
            pred_seen = pred_seen or _looks_like_tag(features[-1])
        counts.add(features[0], features[-2], features[-1])
    counts.finish()
    if counts.tokens == 0:
        raise DataError(f"no tokens to score; expected {EXPECTED}", path)
    for seen, which, column in ((gold_seen, "gold", n_features), (pred_seen, "predicted", n_features + 1)):
        if not seen:
            raise DataError(f"column {column} (the {which} tags) holds no IOB tag (O, B-type, I-type, ...); "
                            f"expected {EXPECTED}", path)
    return report(counts)


def evaluate_file(path: str | Path) -> dict:
    """Score a conlleval-format file; see :func:`evaluate_lines`."""
    return evaluate_lines((line for _, line in iter_lines(path, EXPECTED)), str(path))


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
