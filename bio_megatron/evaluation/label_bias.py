"""Label-bias statistics of an NER dataset (the analysis behind the paper's Table 8).

Definition used here (ASSUMED: the paper's exact wording could not be consulted while writing this;
it is stated so that the numbers are reproducible and can be re-aligned if the paper differs):

    label bias of an evaluation split w.r.t. the training split, per entity type and overall =
    100 x (number of entity mentions in the evaluation split whose surface string also occurs as an
    entity mention of the same type in the training split) / (number of entity mentions in the
    evaluation split).

It measures how much of a test set can be solved by memorising training labels: a high value means
a model is mostly re-labelling strings it has already seen labelled. Mentions are conlleval chunks
(:mod:`bio_megatron.evaluation.conlleval` rules, so ill-formed IOB is chunked the same way), the
surface string is the words joined by single spaces. Also reported: the same ratio over unique
surface strings, the case-insensitive variant, and the share of seen strings that are also labelled
``O`` somewhere in training (label ambiguity).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Sequence

from bio_megatron.evaluation.conlleval import end_of_chunk, split_tag, start_of_chunk


def chunks(words: Sequence[str], tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, start, end-exclusive) chunks of one sentence under conlleval's rules."""
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


def label_bias(train: Iterable[tuple[Sequence[str], Sequence[str]]],
               evaluation: Iterable[tuple[Sequence[str], Sequence[str]]]) -> dict:
    """Label-bias table (see the module docstring) of ``evaluation`` w.r.t. ``train``; values in percent."""
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
        return {"mentions": n, "seen_in_train": len(hit), "label_bias": pct(len(hit), n),
                "label_bias_uncased": pct(hit_lower, n),
                "unique_mentions": len(unique), "unique_seen_in_train": unique_hit,
                "label_bias_unique": pct(unique_hit, len(unique)),
                "seen_also_outside_in_train": pct(ambiguous, len(hit))}

    types = sorted({ty for ty, _ in eval_m})
    return {"overall": row(eval_m), "per_type": {ty: row([m for m in eval_m if m[0] == ty]) for ty in types},
            "train_mentions": dict(Counter(ty for ty, _ in train_m))}
