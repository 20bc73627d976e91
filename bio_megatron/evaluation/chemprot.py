"""ChemProt relation-extraction metric: micro P/R/F1 over the five evaluated classes only.

The BioCreative VI task, BLUE, bio-lm and the BioMegatron paper score ChemProt with micro-averaged
precision, recall and F1 over CPR:3, CPR:4, CPR:5, CPR:6 and CPR:9, the negative class ("false")
excluded. This equals scikit-learn's ``precision_recall_fscore_support(gold, pred,
labels=POSITIVE_LABELS, average="micro")``; micro over all six classes would just be accuracy.

``macro_f1`` is the mean of the five classes' F1 (scikit-learn's ``average="macro"`` over the same labels): bio-lm's
Table 1 names Macro-F1 for ChemProt while the systems it compares with (BioBERT, Table 6) report micro F1, so both are
given.

Values are fractions in [0, 1], as scikit-learn returns them (multiply by 100 for the paper's tables).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Collection, Mapping, Sequence

from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.utils.errors import DataError

POSITIVE_LABELS: tuple[str, ...] = ("CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9")
NEGATIVE_LABEL = "false"
# id 0 is the negative class, the rest sorted: the same rule as the NER label map (pad label first).
CHEMPROT_LABELS: tuple[str, ...] = (NEGATIVE_LABEL,) + POSITIVE_LABELS
# The original corpus has ten groups; those not evaluated (CPR:1, 2, 7, 8, 10) are negatives, not errors.
_CPR_GROUP = re.compile(r"^CPR:\d+$")


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
    macro_f1 = sum(c["f1"] for c in per_class.values()) / len(per_class) if per_class else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "macro_f1": macro_f1, "support": total_gold,
            "accuracy": _ratio(sum(1 for g, p in zip(gold, pred) if g == p), len(gold)),
            "per_class": per_class}


def read_label_column(path: str | Path, id_to_label: Mapping[int, str] | None = None,
                      names: Collection[str] | None = None, ids: bool = True) -> list[str]:
    """Labels from a file with one label per line, or from the last tab-separated field of a NeMo tsv.

    Integer labels are mapped through ``id_to_label`` (default: ``CHEMPROT_LABELS`` order, ``false`` = 0),
    and refused when ``ids`` is false (predictions without the model's label map: its order is its own).
    A line holding a JSON object is read as its ``"label"`` (``bio-megatron predict re``'s output, one object per
    example in order). Every line must have the field count of the first (1 or 2), and every label must be one of
    ``names`` (default: a name of the map or a ChemProt group ``CPR:<n>``): a sentence column read as a label would
    silently count as a negative. Blank lines are skipped; no label at all is an error.
    """
    expected = "one label per line, 'sentence<TAB>label' or JSON lines {\"label\": ...}"
    mapping = dict(id_to_label) if id_to_label is not None else dict(enumerate(CHEMPROT_LABELS))
    known = set(mapping.values()) if names is None else set(names)
    labels: list[str] = []
    n_fields = first_line = 0
    for lineno, line in iter_lines(path, expected):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):  # predict re's JSON line: its label, as if it were the line
            line = _json_label(line, path, lineno, expected)
        fields = line.split("\t")
        if not n_fields:
            n_fields, first_line = len(fields), lineno
            if n_fields > 2:
                raise DataError(f"{n_fields} tab-separated fields; expected {expected}", str(path), lineno)
        elif len(fields) != n_fields:
            raise DataError(f"{len(fields)} tab-separated field(s) but line {first_line} has {n_fields}; "
                            f"expected {expected} on every line", str(path), lineno)
        value = fields[-1].strip()
        if value.lstrip("-").isdigit():
            if not ids:
                raise DataError(f"label id {value} but no --label-ids FILE (the model's label_ids.csv) says which "
                                f"label it is; expected one of {sorted(known)}", str(path), lineno)
            if int(value) not in mapping:
                raise DataError(f"label id {value} is not in the label map {mapping}", str(path), lineno)
            value = mapping[int(value)]
        elif names is not None and value not in known:
            raise DataError(f"unknown label {value[:60]!r}; expected one of the gold labels {sorted(known)}",
                            str(path), lineno)
        elif names is None and value not in known and not _CPR_GROUP.match(value):
            raise DataError(f"unknown label {value[:60]!r}; expected a label id or name of {mapping} "
                            f"(or a ChemProt group CPR:<n>)", str(path), lineno)
        labels.append(value)
    if not labels:
        raise DataError(f"no labels; expected {expected}", str(path))
    return labels


def _json_label(line: str, path: str | Path, lineno: int, expected: str) -> str:
    """The string ``"label"`` of a JSON-object line (DataError naming file and line otherwise)."""
    try:
        rec = json.loads(line)
    except ValueError:
        raise DataError(f"broken JSON; expected {expected}", str(path), lineno) from None
    if not isinstance(rec, dict) or not isinstance(rec.get("label"), str) or "\t" in rec["label"]:
        raise DataError(f"a JSON object without a string \"label\"; expected {expected}", str(path), lineno)
    return rec["label"]
