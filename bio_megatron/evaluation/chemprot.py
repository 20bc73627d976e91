"""ChemProt relation-extraction metric: micro P/R/F1 over the five evaluated classes only.

The BioCreative VI task, BLUE, bio-lm and the BioMegatron paper score ChemProt with micro-averaged
precision, recall and F1 over CPR:3, CPR:4, CPR:5, CPR:6 and CPR:9, the negative class ("false")
excluded. This equals scikit-learn's ``precision_recall_fscore_support(gold, pred,
labels=POSITIVE_LABELS, average="micro")``; micro over all six classes would just be accuracy.

Values are fractions in [0, 1], as scikit-learn returns them (multiply by 100 for the paper's tables).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

from bio_megatron.utils.errors import DataError

POSITIVE_LABELS: tuple[str, ...] = ("CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9")
NEGATIVE_LABEL = "false"
# id 0 is the negative class, the rest sorted: the same rule as the NER label map (pad label first).
CHEMPROT_LABELS: tuple[str, ...] = (NEGATIVE_LABEL,) + POSITIVE_LABELS


def _ratio(num: int, den: int) -> float:
    # scikit-learn returns 0.0 for an undefined ratio (with zero_division="warn", the default)
    return num / den if den else 0.0


def chemprot_scores(gold: Sequence[str], pred: Sequence[str],
                    positives: Sequence[str] = POSITIVE_LABELS) -> dict:
    """Micro precision/recall/F1 over ``positives`` plus a per-class table (precision, recall, f1, support).

    A prediction of a positive class counts as a true positive only when the gold label is the same
    class; everything outside ``positives`` (``false``, CPR:1, ...) is a negative.
    """
    if len(gold) != len(pred):
        raise DataError(f"{len(gold)} gold labels but {len(pred)} predictions")
    pos = list(positives)
    tp, n_pred, n_gold = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred):
        if p in positives:
            n_pred[p] += 1
            if p == g:
                tp[p] += 1
        if g in positives:
            n_gold[g] += 1
    total_tp, total_pred, total_gold = sum(tp.values()), sum(n_pred.values()), sum(n_gold.values())
    precision, recall = _ratio(total_tp, total_pred), _ratio(total_tp, total_gold)
    f1 = _ratio(2 * total_tp, total_pred + total_gold)
    per_class = {}
    for label in pos:
        per_class[label] = {
            "precision": _ratio(tp[label], n_pred[label]),
            "recall": _ratio(tp[label], n_gold[label]),
            "f1": _ratio(2 * tp[label], n_pred[label] + n_gold[label]),
            "support": n_gold[label],
            "predicted": n_pred[label],
        }
    return {"precision": precision, "recall": recall, "f1": f1, "support": total_gold,
            "accuracy": _ratio(sum(1 for g, p in zip(gold, pred) if g == p), len(gold)),
            "per_class": per_class}


def read_label_column(path: str | Path, id_to_label: Mapping[int, str] | None = None) -> list[str]:
    """Labels from a file with one label per line, or from the last tab-separated field of a NeMo tsv.

    Integer labels are mapped through ``id_to_label`` (default: ``CHEMPROT_LABELS`` order, ``false`` = 0).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found (expected one label per line or 'sentence<TAB>label')", str(path))
    mapping = dict(id_to_label) if id_to_label is not None else dict(enumerate(CHEMPROT_LABELS))
    labels = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            value = line.rsplit("\t", 1)[-1].strip()
            if value.lstrip("-").isdigit():
                if int(value) not in mapping:
                    raise DataError(f"label id {value} is not in the label map {mapping}", str(path), lineno)
                value = mapping[int(value)]
            labels.append(value)
    return labels
