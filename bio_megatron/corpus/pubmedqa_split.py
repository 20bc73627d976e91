"""PubMedQA's PQA-L split as BLURB uses it, made from the official release (``ori_pqal.json``).

The release publishes the 1,000 expert-labelled questions in one file and a script that splits them; BLURB (and
LinkBERT's preprocessing) read its outputs ``pqal_fold0/train_set.json`` (450), ``pqal_fold0/dev_set.json`` (50)
and ``test_set.json`` (500). This module is our own implementation of the procedure that script follows (Jin et al.
2019, ``preprocess/split_dataset.py`` of pubmedqa/pubmedqa), written from its description:

* Python's ``random`` seeded with 0, one generator for the whole run;
* a split into ``k`` parts is label-stratified: the PMIDs of each label (yes, no, maybe, in that order) are shuffled
  and cut into ``k`` slices of ``ceil(n / k)``, the last taking the rest; part ``i`` is slice ``i`` of each label;
* when the last part comes out smaller than the first, one PMID drawn at random from each other part moves to it;
* the release is split in 2 (cross-validation half, test half), the first half in 10 folds; fold ``i``'s dev set is
  part ``i`` and its training set the other nine parts, in part order.

Files are written as the script writes them (``json.dump(..., indent=4)``): the outputs equal BLURB's copies byte
for byte, and ``test_set.json``'s PMIDs and labels equal the release's ``test_ground_truth.json``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open

LABELS = ("yes", "no", "maybe")
SEED = 0
FOLDS = 10


def _parts(records: dict[str, dict], k: int, rng: random.Random) -> list[dict[str, dict]]:
    by_label: dict[str, list[str]] = {label: [] for label in LABELS}
    for pmid, rec in records.items():
        by_label[rec["final_decision"]].append(pmid)
    slices = {}
    for label, pmids in by_label.items():
        rng.shuffle(pmids)
        size = math.ceil(len(pmids) / k)
        slices[label] = [pmids[i * size:(i + 1) * size] if i < k - 1 else pmids[i * size:] for i in range(k)]
    parts = [{pmid: records[pmid] for label in LABELS for pmid in slices[label][i]} for i in range(k)]
    if len(parts[-1]) != len(parts[0]):  # evened out: one random PMID of every other part moves to the last
        for part in parts[:-1]:
            pmid = rng.choice(list(part))
            parts[-1][pmid] = part.pop(pmid)
    return parts


def pqal_splits(release: dict[str, dict], fold: int = 0) -> dict[str, dict[str, dict]]:
    """``{"test_set.json": ..., "pqal_fold<fold>/train_set.json": ..., "pqal_fold<fold>/dev_set.json": ...}``."""
    rng = random.Random(SEED)
    cv, test = _parts(release, 2, rng)
    folds = _parts(cv, FOLDS, rng)
    train = {pmid: rec for i, part in enumerate(folds) if i != fold for pmid, rec in part.items()}
    return {"test_set.json": test, f"pqal_fold{fold}/train_set.json": train,
            f"pqal_fold{fold}/dev_set.json": folds[fold]}


def write_pqal_splits(folder: str | Path) -> list[Path]:
    """Read ``<folder>/ori_pqal.json`` and write BLURB's three files beside it (atomically); return their paths."""
    folder = Path(folder)
    source = folder / "ori_pqal.json"
    try:
        release = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read PubMedQA's release: {exc}", str(source)) from None
    bad = [p for p, r in release.items() if not isinstance(r, dict) or r.get("final_decision") not in LABELS] \
        if isinstance(release, dict) else ["(not a JSON object)"]
    if bad:
        raise DataError(f"expected PMID -> {{..., \"final_decision\": yes|no|maybe}}; bad: {bad[:3]}", str(source))
    written = []
    for name, records in pqal_splits(release).items():
        path = folder / name
        path.parent.mkdir(exist_ok=True)
        with atomic_open(path, "w", encoding="utf-8") as fh:
            json.dump(records, fh, indent=4)
        written.append(path)
    return written
