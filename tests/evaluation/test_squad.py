"""SQuAD scoring: hand-checked cases of the official v1.1/v2.0 rules and a real v2 slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bio_megatron.evaluation.squad import evaluate, f1_v1, f1_v2, normalize_answer
from bio_megatron.utils.errors import DataError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "qa"


def _data(qas: list[dict], version: str = "v2.0") -> dict:
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def test_normalisation_and_token_f1():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    # pred "the cat sat" -> [cat, sat]; gold "a cat" -> [cat]: P=1/2, R=1, F1=2/3
    assert f1_v2("a cat", "the cat sat") == pytest.approx(2 / 3)
    # empty vs empty: v2 gives 1, v1 gives 0 (no shared token)
    assert f1_v2("", "") == 1.0 and f1_v1("", "") == 0.0
    assert f1_v2("cat", "") == 0.0


def test_v2_hand_case_with_unanswerable():
    qas = [
        {"id": "q1", "question": "?", "answers": [{"text": "Denmark", "answer_start": 0},
                                                  {"text": "in Denmark", "answer_start": 0}]},
        {"id": "q2", "question": "?", "answers": [{"text": "10th century", "answer_start": 0}]},
        {"id": "q3", "question": "?", "answers": [], "is_impossible": True},
        {"id": "q4", "question": "?", "answers": [], "is_impossible": True},
    ]
    preds = {"q1": "denmark.", "q2": "the 10th", "q3": "", "q4": "Norway"}
    r = evaluate(_data(qas), preds)
    # q1 exact (normalised), q2 F1 = 2*(1*0.5)/(1.5) = 2/3, q3 right, q4 wrong
    assert r["exact"] == pytest.approx(100 * 2 / 4)
    assert r["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0) / 4)
    assert (r["HasAns_total"], r["NoAns_total"], r["total"]) == (2, 2, 4)
    assert r["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert r["NoAns_exact"] == pytest.approx(50.0)
    assert list(r)[:3] == ["exact", "f1", "total"]


def test_v2_best_threshold_sweep():
    qas = [{"id": "a", "question": "?", "answers": [{"text": "x", "answer_start": 0}]},
           {"id": "b", "question": "?", "answers": []}]
    preds = {"a": "x", "b": "y"}
    na = {"a": 0.2, "b": 0.9}
    r = evaluate(_data(qas), preds, na_probs=na)
    # sweep from "all empty" (1 right): adding a (correct) -> 2 at thresh 0.2; adding b (wrong) -> 1
    assert r["best_exact"] == pytest.approx(100.0) and r["best_exact_thresh"] == pytest.approx(0.2)
    r = evaluate(_data(qas), preds, na_probs=na, na_prob_thresh=0.5)
    assert r["exact"] == pytest.approx(100.0)  # b's answer is replaced by "" above the threshold


def test_v1_keys_and_missing_prediction():
    qas = [{"id": "q1", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
           {"id": "q2", "question": "?", "answers": [{"text": "red", "answer_start": 0}]}]
    r = evaluate(_data(qas, "1.1"), {"q1": "paris"})
    assert r == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(50.0)}
    with pytest.raises(DataError, match="no prediction"):
        evaluate(_data(qas), {"q1": "paris"})


def test_real_v2_slice_gold_and_empty_predictions():
    data = json.loads((FIX / "squad_v2_dev_slice.json").read_text())
    qas = [q for a in data["data"] for p in a["paragraphs"] for q in p["qas"]]
    n, n_no = len(qas), sum(1 for q in qas if not q["answers"])
    assert 0 < n_no < n
    gold = {q["id"]: (q["answers"][0]["text"] if q["answers"] else "") for q in qas}
    r = evaluate(data, gold)
    assert r["exact"] == r["f1"] == 100.0 and r["NoAns_total"] == n_no
    # predicting "" everywhere is right exactly on the unanswerable questions
    r = evaluate(data, {k: "" for k in gold})
    assert r["exact"] == pytest.approx(100 * n_no / n) and r["HasAns_f1"] == 0.0
    # a prediction equal to the *last* gold answer counts too (max over answers)
    last = {q["id"]: (q["answers"][-1]["text"] if q["answers"] else "") for q in qas}
    assert evaluate(data, last)["exact"] == 100.0
