"""BLUE's HoC metric and the clinical tasks' metrics against independent computations, and their ``evaluate``
commands end to end (scores, and exit 2 with file and line on bad input)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from reliability.cli_log import run_cli
from bio_megatron.evaluation.hoc_blue import hoc_blue_scores
from bio_megatron.tasks.blurb_data import read_hoc

ROOT = Path(__file__).resolve().parents[2]
BLURB_FIX = ROOT / "tests" / "fixtures" / "blurb" / "HoC"
BLURB = ROOT.parent / "shared" / "data" / "blurb"


def _blue_oracle(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[float, float, float]:
    """BLUE's HoC formula re-derived from its definition on abstract x hallmark 0/1 matrices: per-abstract
    precision |G&P|/|P| and recall |G&P|/|G| (0 when undefined), averaged, F the harmonic mean of the averages."""
    hit = (y_true & y_pred).sum(1).astype(float)
    n_pred, n_gold = y_pred.sum(1), y_true.sum(1)
    p = np.divide(hit, n_pred, out=np.zeros_like(hit), where=n_pred > 0).mean()
    r = np.divide(hit, n_gold, out=np.zeros_like(hit), where=n_gold > 0).mean()
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _abstract_matrices(sentences, pred_sets) -> tuple[np.ndarray, np.ndarray]:
    docs = sorted({e.id.split("_")[0] for e in sentences})  # BLUE's key: the index before the first "_"
    row = {d: k for k, d in enumerate(docs)}
    y_true, y_pred = np.zeros((len(docs), 10), bool), np.zeros((len(docs), 10), bool)
    for e, p in zip(sentences, pred_sets):
        for i in e.labels:
            y_true[row[e.id.split("_")[0]], i] = True
        for i in p:
            y_pred[row[e.id.split("_")[0]], i] = True
    return y_true, y_pred


@pytest.mark.parametrize("source", ["fixture", "shared"])
def test_hoc_blue_equals_rederived_formula_on_perturbed_predictions(source):
    path = BLURB_FIX / "test.tsv" if source == "fixture" else BLURB / "HoC" / "test.tsv"
    if not path.is_file():
        pytest.skip("needs ../shared/data/blurb (GPL-3.0 data is not in the project)")
    sentences = read_hoc(path)
    rng = np.random.default_rng(7)
    gold_bits = np.array([[i in e.labels for i in range(10)] for e in sentences])
    seen = set()
    for rate in (0.0, 0.05, 0.3):
        pred_bits = gold_bits ^ (rng.random(gold_bits.shape) < rate)
        pred = [set(np.flatnonzero(row).tolist()) for row in pred_bits]
        ours = hoc_blue_scores([e.doc_id for e in sentences], [e.labels for e in sentences], pred)
        y_true, y_pred = _abstract_matrices(sentences, pred)
        assert [ours.precision, ours.recall, ours.f1] == pytest.approx(list(_blue_oracle(y_true, y_pred)), abs=1e-12)
        assert ours.documents == len(y_true) and ours.documents_without_label == int((~y_true.any(1)).sum())
        seen.add(round(ours.f1, 9))
    assert len(seen) == 3  # the perturbations move the score: the comparison is not of constants
    # BLUE's F is not BLURB's micro F1: on the perturbed predictions the two differ
    from bio_megatron.evaluation.blurb import hoc_scores
    micro = hoc_scores([e.doc_id for e in sentences], [e.labels for e in sentences], pred)
    assert abs(micro.f1 - ours.f1) > 1e-6


def test_hoc_blue_hand_computed():
    # abstract A: gold {0, 8}, predicted {0, 8, 9} -> p 2/3, r 1; B: gold {}, predicted {1} -> 0, 0 (undefined
    # recall counted 0); C: gold {5, 7}, predicted {5} -> 1, 1/2. P = 5/9, R = 1/2, F = 2PR/(P+R) = 10/19
    ours = hoc_blue_scores(["A", "A", "B", "C", "C"], [{0}, {8}, set(), {5, 7}, set()],
                           [{0, 9}, {8}, {1}, {5}, set()])
    assert (ours.precision, ours.recall, ours.f1) == pytest.approx((5 / 9, 1 / 2, 10 / 19), abs=1e-12)
    assert (ours.documents, ours.sentences, ours.documents_without_label) == (3, 5, 1)


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc, msg = run_cli(argv, logging.WARNING, " | ")
    return rc, capsys.readouterr().out, msg


def test_cli_evaluate_hoc_metric_blue_and_default_blurb(capsys, tmp_path):
    gold, pred = str(BLURB_FIX / "test.tsv"), str(BLURB_FIX / "test.pred.jsonl")
    rc, out, msg = _run(capsys, ["evaluate", "hoc", "--gold", gold, "--pred", pred, "--metric", "blue",
                                 "--json", str(tmp_path / "blue.json")])
    assert rc == 0, msg
    blue = json.loads(out)
    assert blue["metric"] == "blue_abstract_f1" and blue["score"] == pytest.approx(10 / 19, abs=1e-12)
    assert json.loads((tmp_path / "blue.json").read_text()) == blue
    rc, out, msg = _run(capsys, ["evaluate", "hoc", "--gold", gold, "--pred", pred])
    assert rc == 0 and json.loads(out)["metric"] == "micro_f1"  # the default is unchanged: BLURB's


def test_cli_evaluate_hoc_blue_refuses_bad_predictions(capsys, tmp_path):
    lines = (BLURB_FIX / "test.pred.jsonl").read_text().splitlines()
    lines[2] = '{"id": "9000001_s2", "labels": [10]}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    rc, out, msg = _run(capsys, ["evaluate", "hoc", "--gold", str(BLURB_FIX / "test.tsv"), "--pred", str(bad),
                                 "--metric", "blue"])
    assert (rc, out) == (2, "") and f"{bad}:3:" in msg and "Traceback" not in msg


# --- MedNLI accuracy and ClinicalSTS Pearson: the CLI against scikit-learn / scipy on perturbed predictions ---
CLINICAL = ROOT / "tests" / "fixtures" / "clinical"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cli_mednli_accuracy_equals_sklearn(capsys, tmp_path, seed):
    metrics = pytest.importorskip("sklearn.metrics")
    from bio_megatron.tasks.clinical_data import MEDNLI_LABELS, read_mednli

    gold_file = CLINICAL / "mednli" / "mli_train_v1.jsonl"
    gold = read_mednli(gold_file)
    rng = np.random.default_rng(seed)
    pred = [MEDNLI_LABELS[rng.integers(3)] if rng.random() < 0.4 else e.label for e in gold]
    lines = [json.dumps({"id": e.id, "label": p}) for e, p in zip(gold, pred)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines[::-1]) + "\n")  # order is free: matched by id
    rc, out, msg = _run(capsys, ["evaluate", "mednli", "--gold", str(gold_file), "--pred", str(tmp_path / "p.jsonl")])
    assert rc == 0, msg
    result = json.loads(out)
    g = [e.label for e in gold]
    assert result["metric"] == "accuracy" and result["score"] == pytest.approx(metrics.accuracy_score(g, pred),
                                                                               abs=1e-12)
    assert result["macro_f1"] == pytest.approx(metrics.f1_score(g, pred, labels=list(MEDNLI_LABELS),
                                                                average="macro", zero_division=0), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cli_clinicalsts_pearson_equals_scipy(capsys, tmp_path, seed):
    stats = pytest.importorskip("scipy.stats")
    from bio_megatron.tasks.clinical_data import read_clinicalsts

    gold_file = CLINICAL / "clinicalsts" / "clinicalSTS2019.train.txt"
    gold = read_clinicalsts(gold_file)
    rng = np.random.default_rng(seed)
    pred = [e.score + float(rng.normal(0, 1.5)) for e in gold]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": e.id, "score": p}) + "\n"
                                              for e, p in zip(gold, pred)))
    rc, out, msg = _run(capsys, ["evaluate", "clinicalsts", "--gold", str(gold_file),
                                 "--pred", str(tmp_path / "p.jsonl")])
    assert rc == 0, msg
    result = json.loads(out)
    oracle = stats.pearsonr([e.score for e in gold], pred)[0]
    assert result["metric"] == "pearson" and result["score"] == pytest.approx(oracle, abs=1e-12)
    assert result["pairs"] == 8
