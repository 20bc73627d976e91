"""ChemProt micro-F1 over the positive classes vs. scikit-learn, on real labels."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bio_megatron.evaluation.chemprot import CHEMPROT_LABELS, POSITIVE_LABELS, chemprot_scores, read_label_column
from bio_megatron.tasks.re_data import read_chemprot_original
from bio_megatron.utils.errors import DataError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "re"


def test_hand_case():
    gold = ["CPR:3", "CPR:4", "false", "false", "CPR:9"]
    pred = ["CPR:3", "false", "CPR:4", "false", "CPR:6"]
    r = chemprot_scores(gold, pred)
    # tp=1 (CPR:3); predicted positives = 3 (CPR:3, CPR:4, CPR:6); gold positives = 3
    assert (r["precision"], r["recall"], r["f1"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert r["accuracy"] == pytest.approx(2 / 5)  # what micro over all six classes would give


def test_equals_sklearn_on_real_chemprot_labels():
    metrics = pytest.importorskip("sklearn.metrics")
    gold = [e.label for e in read_chemprot_original(FIX / "chemprot_development")]
    assert {"false", "CPR:4"} <= set(gold)
    for seed in range(5):
        rng = random.Random(seed)
        pred = [g if rng.random() < 0.6 else rng.choice(CHEMPROT_LABELS) for g in gold]
        ours = chemprot_scores(gold, pred)
        p, r, f, _ = metrics.precision_recall_fscore_support(gold, pred, labels=list(POSITIVE_LABELS),
                                                             average="micro", zero_division=0)
        assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx((p, r, f), abs=1e-12)
        macro = metrics.f1_score(gold, pred, labels=list(POSITIVE_LABELS), average="macro", zero_division=0)
        assert ours["macro_f1"] == pytest.approx(macro, abs=1e-12)  # bio-lm's Table 1 names Macro-F1
        pc, rc, fc, sc = metrics.precision_recall_fscore_support(gold, pred, labels=list(POSITIVE_LABELS),
                                                                 zero_division=0)
        for i, label in enumerate(POSITIVE_LABELS):
            row = ours["per_class"][label]
            assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
                (pc[i], rc[i], fc[i], sc[i]), abs=1e-12)


def test_label_column_reader(tmp_path):
    f = tmp_path / "gold.tsv"
    f.write_text("a @CHEMICAL$ b @GENE$\t2\nc\t0\n")
    assert read_label_column(f) == ["CPR:4", "false"]
    f.write_text("x\t9\n")
    with pytest.raises(DataError, match=r"gold\.tsv:1:"):
        read_label_column(f)
