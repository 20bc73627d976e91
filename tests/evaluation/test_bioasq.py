"""BioASQ factoid scores vs. the official evaluator's own output (tests/fixtures/bioasq, see its SOURCES.md),
hand-checked cases, and the n-best -> submission pooling."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bio_megatron.cli import main
from bio_megatron.evaluation.bioasq import (build_submission, factoid_scores, golden_factoids, pool_nbest,
                                            question_id, submission_answers)
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import load_json

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bioasq"
KEYS = ("strict_accuracy", "lenient_accuracy", "mrr")
# case -> the official output it is compared with; "missing" crashes with -e 5 (see missing.official.out), so
# its reference is the -e 9 run, whose factoid path is the same but skips questions without a response
OFFICIAL = {"normalisation": "normalisation.official.out", "ranking": "ranking.official.out",
            "submission_quirks": "submission_quirks.official.out", "missing": "missing.official-e9.out"}


def _official(name: str) -> dict:
    """Factoid strict, lenient, MRR: the 2nd-4th of the ten numbers ``EvaluatorTask1b -phaseB`` prints."""
    numbers = (FIX / name).read_text().split()
    assert len(numbers) == 10, f"{name}: not an EvaluatorTask1b phase B line"
    return dict(zip(KEYS, map(float, numbers[1:4])))


def _ours(case: str) -> dict:
    g, s = FIX / f"{case}.golden.json", FIX / f"{case}.submission.json"
    return factoid_scores(golden_factoids(load_json(g), str(g)), submission_answers(load_json(s), str(s)))


def _cli(capsys, case: str) -> tuple[int, dict | None]:
    rc = main(["evaluate", "bioasq", "--golden", str(FIX / f"{case}.golden.json"),
               "--predictions", str(FIX / f"{case}.submission.json")])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else None)


@pytest.mark.parametrize("case", list(OFFICIAL))
def test_equals_official_evaluator_output(case, capsys):
    official = _official(OFFICIAL[case])
    rc, cli = _cli(capsys, case)
    assert rc == 0
    for ours in (_ours(case), cli):
        for key in KEYS:
            assert ours[key] == official[key], (case, key)  # same summation order: bit-identical


def test_scored_and_missing_counts():
    assert (_ours("normalisation")["scored_questions"], _ours("normalisation")["missing_questions"]) == (6, 0)
    assert (_ours("submission_quirks")["scored_questions"], _ours("submission_quirks")["missing_questions"]) == (5, 0)
    assert (_ours("missing")["scored_questions"], _ours("missing")["missing_questions"]) == (2, 2)
    assert "NullPointerException" in (FIX / "missing.official.out").read_text()  # -e 5 gives no scores here


def test_flat_list_is_a_clear_error(capsys):
    # the official reader stops on it (flat_list.official.out); we name the file, the question and the shape
    assert "Expected BEGIN_ARRAY but was STRING" in (FIX / "flat_list.official.out").read_text()
    path = str(FIX / "flat_list.submission.json")
    with pytest.raises(DataError, match=r'flat_list\.submission\.json: question \'60a1b2c3d4e5f60718293a01\' '
                                        r'\(#0\): "exact_answer" must be .*\[\["a"\], \["b"\]\]'):
        submission_answers(load_json(path), path)
    with pytest.raises(DataError, match=r"\[\['x'\], 'y'\]"):
        factoid_scores({"q": [["x"]]}, {"q": [["x"], "y"]})
    rc, out = _cli(capsys, "flat_list")
    assert rc == 2 and out is None


def test_null_exact_answer_scores_like_an_absent_one():
    # the official reader stops on null (null_exact_answer.official.out); we score the question 0
    assert "Expected a name but was NULL" in (FIX / "null_exact_answer.official.out").read_text()
    ours = _ours("null_exact_answer")
    assert (ours["strict_accuracy"], ours["lenient_accuracy"], ours["mrr"], ours["scored_questions"]) == (0.5, 0.5,
                                                                                                         0.5, 2)


def test_scores_hand_case():
    golden = {"q1": [["BRCA1", "breast cancer 1"]], "q2": ["Wnt", "wingless"], "q3": [["x"]], "q4": [["y"]],
              "q5": [["TP53"]], "q6": [["z"]]}
    system = {
        "q1": [["brca1"], ["other"]],                        # rank 1 (case-insensitive)
        "q2": [["a"], [], ["b"], ["WINGLESS"]],              # rank 3: the empty entry takes no rank
        "q3": [["a"], ["b"], ["c"], ["d"], ["e"], ["x"]],    # rank 6: all answers are scored
        # q4 missing from the submission: not scored
        "q5": [["p53 protein", "TP53"]],                     # only the first string of an entry counts
        "q6": None,                                          # no exact_answer: scores 0
    }
    r = factoid_scores(golden, system)
    assert (r["scored_questions"], r["missing_questions"]) == (5, 1)
    assert r["strict_accuracy"] == pytest.approx(1 / 5)
    assert r["lenient_accuracy"] == pytest.approx(3 / 5)
    assert r["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 6) / 5)


def test_nothing_scored_gives_zero():
    r = factoid_scores({"q1": [["x"]]}, {"other": [["x"]]})
    assert (r["strict_accuracy"], r["lenient_accuracy"], r["mrr"], r["scored_questions"]) == (0.0, 0.0, 0.0, 0)


def test_more_than_five_answers_warns(caplog):
    logger = logging.getLogger("bio_megatron")
    logger.addHandler(caplog.handler)  # the project logger does not propagate to the root logger
    try:
        factoid_scores({"q1": [["x"]]}, {"q1": [[a] for a in "abcdefx"]})
    finally:
        logger.removeHandler(caplog.handler)
    assert any("more than 5" in rec.getMessage() and "q1" in rec.getMessage() for rec in caplog.records)


def test_submission_reader_keeps_first_duplicate():
    sub = {"questions": [{"id": "a", "exact_answer": [["x"]]}, {"id": "a", "exact_answer": [["y"]]},
                         {"id": "b"}, {"id": "c", "exact_answer": "yes"}]}
    assert submission_answers(sub) == {"a": [["x"]], "b": None, "c": "yes"}
    with pytest.raises(DataError, match=r"sub\.json: question #0 needs a string \"id\""):
        submission_answers({"questions": [{"exact_answer": [["x"]]}]}, "sub.json")


def test_golden_reader_keeps_only_factoids():
    g = golden_factoids({"questions": [{"id": "a", "type": "factoid", "exact_answer": [["x"]]},
                                       {"id": "b", "type": "list", "exact_answer": [["y"]]},
                                       {"id": "c", "type": "factoid", "exact_answer": ["z", "z2"]}]})
    assert list(g) == ["a", "c"]
    assert factoid_scores(g, {"c": [["Z2"]]})["strict_accuracy"] == 1.0  # flat golden list: synonyms of one answer
    with pytest.raises(DataError, match=r"g\.json: factoid question 'a' \(#1\) is listed twice"):
        golden_factoids({"questions": [{"id": "a", "type": "factoid", "exact_answer": [["x"]]}] * 2}, "g.json")


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


def test_pooling_keeps_the_most_probable_spelling():
    # BioBERT sorts all pooled entries by probability before merging: "EGFR" (0.6, second snippet) wins over
    # "Egfr" (0.2, first snippet); equal probabilities keep snippet order
    nbest = {"q_001": [{"text": "Egfr", "probability": 0.2}, {"text": "Kinase", "probability": 0.3}],
             "q_002": [{"text": "EGFR", "probability": 0.6}, {"text": "kinase", "probability": 0.3}]}
    assert pool_nbest(nbest)["q"] == [("EGFR", pytest.approx(0.8)), ("Kinase", pytest.approx(0.6))]
