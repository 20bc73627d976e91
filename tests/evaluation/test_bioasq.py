"""BioASQ factoid scores and the n-best -> submission pooling, hand-checked."""

from __future__ import annotations

import pytest

from bio_megatron.evaluation.bioasq import build_submission, factoid_scores, golden_factoids, question_id


def test_scores_hand_case():
    golden = {"q1": [["BRCA1", "breast cancer 1"]], "q2": ["Wnt"], "q3": [["x"]], "q4": [["y"]]}
    system = {
        "q1": [["brca1"], ["other"]],            # rank 1 (case-insensitive)
        "q2": [["a"], ["b"], ["WNT"]],             # rank 3
        "q3": [["a"], ["b"], ["c"], ["d"], ["e"], ["x"]],  # rank 6: beyond the 5 scored answers
        # q4 missing from the submission: scores 0
    }
    r = factoid_scores(golden, system)
    assert r["strict_accuracy"] == pytest.approx(1 / 4)
    assert r["lenient_accuracy"] == pytest.approx(2 / 4)
    assert r["mrr"] == pytest.approx((1 + 1 / 3) / 4)


def test_golden_reader_keeps_only_factoids():
    g = golden_factoids({"questions": [{"id": "a", "type": "factoid", "exact_answer": [["x"]]},
                                       {"id": "b", "type": "list", "exact_answer": [["y"]]}]})
    assert list(g) == ["a"]


def test_submission_pools_snippets_and_merges():
    nbest = {
        "55031181e9bde69634000014_001": [
            {"text": "EGFR.", "probability": 0.5}, {"text": "kinase", "probability": 0.3},
            {"text": "", "probability": 0.1}, {"text": "x" * 101, "probability": 0.1}],
        "55031181e9bde69634000014_002": [
            {"text": "egfr ,", "probability": 0.4}, {"text": "HER2", "probability": 0.35},
            {"text": "a", "probability": 0.1}, {"text": "b", "probability": 0.08},
            {"text": "c", "probability": 0.07}],
        "other_001": [{"text": "z", "probability": 1.0}],
    }
    sub = build_submission(nbest)
    q = {x["id"]: x["exact_answer"] for x in sub["questions"]}
    assert question_id("55031181e9bde69634000014_002") == "55031181e9bde69634000014"
    # EGFR merged: 0.5 + 0.4 = 0.9; then HER2 .35, kinase .3, a .1, b .08; c (.07) is 6th and dropped;
    # the empty answer and the 101-character one are dropped
    assert q["55031181e9bde69634000014"] == [["EGFR"], ["HER2"], ["kinase"], ["a"], ["b"]]
    assert q["other"] == [["z"]]
    # the submission scores as expected against a golden file
    assert factoid_scores({"55031181e9bde69634000014": [["egfr"]]}, q)["strict_accuracy"] == 1.0
