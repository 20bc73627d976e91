"""Train/test mention overlap of an NER dataset: how much of a test set is memorisable.

Not the paper's "label bias" (that is :mod:`bio_megatron.evaluation.label_bias`, Table 8). This is the
memorisation view of Kim & Kang ("How Do Your Biomedical Named Entity Recognition Models Generalize to
Novel Entities?", IEEE Access 2022): the share of entity mentions of an evaluation split whose exact
surface string is labelled with the same type somewhere in the training split, overall and per type.
A high value means a model is mostly re-labelling strings it has already seen labelled.

Mentions are conlleval chunks (:func:`bio_megatron.evaluation.conlleval.chunks`, so ill-formed IOB is
chunked the same way), the surface string is the words joined by single spaces. Also reported: the
same ratio over unique surface strings, the case-insensitive variant, and the share of seen strings
that also occur outside any entity in training (label ambiguity). Values in percent.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Sequence

from bio_megatron.evaluation.conlleval import chunks


def _mentions(sentences: Iterable[tuple[Sequence[str], Sequence[str]]]) -> list[tuple[str, str]]:
    return [(ty, " ".join(words[s:e])) for words, tags in sentences for ty, s, e in chunks(words, tags)]


def _outside_strings(sentences, max_len: int) -> set[str]:
    """Word n-grams (up to ``max_len`` words) that occur fully outside any entity in training."""
    seen = set()
    for words, tags in sentences:
        run: list[str] = []
        for w, t in list(zip(words, tags)) + [("", "X")]:
            if t == "O":
                run.append(w)
                continue
            for i in range(len(run)):
                for j in range(i + 1, min(len(run), i + max_len) + 1):
                    seen.add(" ".join(run[i:j]))
            run = []
    return seen


def mention_overlap(train: Iterable[tuple[Sequence[str], Sequence[str]]],
                    evaluation: Iterable[tuple[Sequence[str], Sequence[str]]]) -> dict:
    """Overlap table (see the module docstring) of ``evaluation`` w.r.t. ``train``; values in percent."""
    train = list(train)
    train_m = _mentions(train)
    eval_m = _mentions(evaluation)
    seen = defaultdict(set)
    seen_lower = defaultdict(set)
    for ty, text in train_m:
        seen[ty].add(text)
        seen_lower[ty].add(text.lower())
    max_len = max((len(t.split()) for _, t in eval_m), default=1)
    outside = _outside_strings(train, max_len)

    def row(mentions: list[tuple[str, str]]) -> dict:
        n = len(mentions)
        hit = [m for m in mentions if m[1] in seen[m[0]]]
        hit_lower = sum(1 for ty, t in mentions if t.lower() in seen_lower[ty])
        unique = set(mentions)
        unique_hit = sum(1 for ty, t in unique if t in seen[ty])
        ambiguous = sum(1 for _, t in hit if t in outside)
        pct = (lambda a, b: 100.0 * a / b if b else 0.0)
        return {"mentions": n, "seen_in_train": len(hit), "seen_share": pct(len(hit), n),
                "seen_share_uncased": pct(hit_lower, n),
                "unique_mentions": len(unique), "unique_seen_in_train": unique_hit,
                "seen_share_unique": pct(unique_hit, len(unique)),
                "seen_also_outside_in_train": pct(ambiguous, len(hit))}

    types = sorted({ty for ty, _ in eval_m})
    return {"overall": row(eval_m), "per_type": {ty: row([m for m in eval_m if m[0] == ty]) for ty in types},
            "train_mentions": dict(Counter(ty for ty, _ in train_m))}
