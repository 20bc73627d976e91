"""Numbers of a suite's tables: spread over seeds, the head-grid point chosen on dev, task-type averages and
the BLURB score (the macro average of the task-type averages, so that NER's five datasets weigh as much as
BIOSSES alone)."""

from __future__ import annotations

import statistics
from typing import Iterable, Sequence


def spread(values: Sequence[float]) -> dict:
    """mean, median, sample standard deviation (n - 1; 0 for one value), min, max and n."""
    values = list(values)
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values),
            "n": len(values)}


def select_point(dev_by_point: dict, seeds: int) -> tuple[object, bool]:
    """The head-grid point with the best mean dev score over its seeds (sweep.py's rule), preferring points
    whose every seed has finished; returns (point, complete). ``dev_by_point``: point -> dev values."""
    complete = {p: v for p, v in dev_by_point.items() if len(v) >= seeds}
    pool = complete or {p: v for p, v in dev_by_point.items() if v}
    best = max(pool, key=lambda p: statistics.fmean(pool[p]))  # first of equals: the grid's order
    return best, bool(complete)


def task_type_averages(means: dict[str, float | None], groups: dict[str, str],
                       order: Iterable[str]) -> list[dict]:
    """Per task type (in ``order``): the mean of its datasets' means, over the datasets that have one.
    ``means``: dataset -> mean score or None (missing); ``groups``: dataset -> task type."""
    out = []
    for group in order:
        members = [k for k, g in groups.items() if g == group]
        have = [k for k in members if means.get(k) is not None]
        out.append({"task_type": group, "average": statistics.fmean(means[k] for k in have) if have else None,
                    "datasets": have, "missing": [k for k in members if k not in have]})
    return out


def blurb_score(types: list[dict]) -> float | None:
    """The macro average of the task-type averages over the types that have one (None if none has)."""
    have = [t["average"] for t in types if t["average"] is not None]
    return statistics.fmean(have) if have else None
