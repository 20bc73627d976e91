"""``model.dataset.max_train_examples`` / ``max_eval_examples``: which N examples of a split a run keeps.

With ``model.dataset.max_examples_seed`` null (the default) the first N, as before. With a seed (``benchmark
--max-examples`` sets one, recorded in the suite's plan), N examples drawn at random with that seed and, for
classification, stratified by label: each label keeps its share of the split (largest remainders, so every count
is within one of ``N * share``). The first N rows of a file are often one class (GAD's first 64 test rows are:
"F1 100.00" on a smoke run); a stratified sample is not. The sample keeps the file's order and is the same for
the same seed.
"""

from __future__ import annotations

import random
from typing import Callable, Hashable, Sequence, TypeVar

T = TypeVar("T")


def take(items: Sequence[T], n: int | None, seed: int | None = None,
         label_of: Callable[[T], Hashable] | None = None) -> list[T]:
    """``n`` of ``items`` (all of them when ``n`` is None or not smaller): the first ``n`` without ``seed``,
    else a seeded random sample, stratified by ``label_of`` when given."""
    items = list(items)
    if n is None or n >= len(items):
        return items
    if seed is None:
        return items[:n]
    rng = random.Random(seed)
    if label_of is None:
        return [items[i] for i in sorted(rng.sample(range(len(items)), n))]
    strata: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        strata.setdefault(label_of(item), []).append(i)
    quota = {k: n * len(v) / len(items) for k, v in strata.items()}
    counts = {k: int(q) for k, q in quota.items()}
    # the examples left after the floors go to the largest remainders (ties: the larger stratum, then file order)
    order = sorted(strata, key=lambda k: (-(quota[k] - counts[k]), -len(strata[k]), strata[k][0]))
    for k in order[:n - sum(counts.values())]:
        counts[k] += 1
    keep = [i for k in strata for i in rng.sample(strata[k], counts[k])]
    return [items[i] for i in sorted(keep)]
