"""The evaluate/analyse commands print one JSON object; mention overlap on a hand case and real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bio_megatron.cli import main
from bio_megatron.evaluation.conlleval import evaluate_file
from bio_megatron.evaluation.conlleval import chunks
from bio_megatron.evaluation.mention_overlap import mention_overlap

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else None)


def test_evaluate_ner_and_re(capsys, tmp_path):
    rc, out = _run(capsys, ["evaluate", "ner", "--input", str(FIX / "ner/ill_formed.conll")])
    assert rc == 0 and out["f1"] == pytest.approx(evaluate_file(FIX / "ner/ill_formed.conll")["f1"])
    assert set(out["per_type"]) == {"Chemical", "Disease"}
    (tmp_path / "g.txt").write_text("CPR:3\nfalse\nCPR:4\n")
    (tmp_path / "p.txt").write_text("1\n0\n1\n")  # ids: read through the model's label map
    (tmp_path / "label_ids.csv").write_text("false\nCPR:3\nCPR:4\nCPR:5\nCPR:6\nCPR:9\n")
    rc, out = _run(capsys, ["evaluate", "re", "--gold", str(tmp_path / "g.txt"), "--pred", str(tmp_path / "p.txt"),
                            "--label-ids", str(tmp_path / "label_ids.csv")])
    assert rc == 0 and out["precision"] == pytest.approx(0.5) and out["recall"] == pytest.approx(0.5)


def test_evaluate_squad_bioasq_and_submission(capsys, tmp_path):
    data = json.loads((FIX / "qa/squad_v2_dev_slice.json").read_text())
    preds = {q["id"]: "" for a in data["data"] for p in a["paragraphs"] for q in p["qas"]}
    (tmp_path / "p.json").write_text(json.dumps(preds))
    rc, out = _run(capsys, ["evaluate", "squad", "--data", str(FIX / "qa/squad_v2_dev_slice.json"),
                            "--predictions", str(tmp_path / "p.json")])
    assert rc == 0 and out["NoAns_exact"] == 100.0 and out["HasAns_exact"] == 0.0
    (tmp_path / "nbest.json").write_text(json.dumps({"q1_001": [{"text": "Wnt.", "probability": 0.6}],
                                                     "q1_002": [{"text": "notch", "probability": 0.7}]}))
    rc, sub = _run(capsys, ["evaluate", "bioasq-submission", "--nbest", str(tmp_path / "nbest.json"),
                            "--out", str(tmp_path / "sub.json")])
    assert rc == 0 and sub["questions"][0]["exact_answer"] == [["notch"], ["Wnt"]]
    (tmp_path / "golden.json").write_text(json.dumps({"questions": [
        {"id": "q1", "type": "factoid", "exact_answer": [["wnt"]]}]}))
    rc, out = _run(capsys, ["evaluate", "bioasq", "--golden", str(tmp_path / "golden.json"),
                            "--predictions", str(tmp_path / "sub.json")])
    assert rc == 0 and (out["strict_accuracy"], out["lenient_accuracy"], out["mrr"]) == (0.0, 1.0, 0.5)


def test_user_errors_exit_nonzero_without_traceback(capsys, tmp_path):
    (tmp_path / "bad.json").write_text("{")
    rc, out = _run(capsys, ["evaluate", "squad", "--data", str(tmp_path / "bad.json"),
                            "--predictions", str(tmp_path / "bad.json")])
    assert rc == 2 and out is None


def test_mention_overlap_hand_case_and_cli(capsys):
    train = [(["aspirin", "and", "heparin", "use"], ["B-Chemical", "O", "B-Chemical", "O"])]
    evaluation = [(["aspirin", "with", "Heparin", "or", "warfarin", "."],
                   ["B-Chemical", "O", "B-Chemical", "O", "B-Chemical", "O"]),
                  (["aspirin"], ["B-Chemical"])]
    r = mention_overlap(train, evaluation)["overall"]
    # 4 mentions: aspirin x2 seen, Heparin only seen uncased, warfarin unseen
    assert (r["mentions"], r["seen_in_train"]) == (4, 2)
    assert r["seen_share"] == pytest.approx(50.0) and r["seen_share_uncased"] == pytest.approx(75.0)
    assert r["seen_share_unique"] == pytest.approx(100 / 3)
    assert chunks(["a", "b", "c"], ["I-X", "I-Y", "O"]) == [("X", 0, 1), ("Y", 1, 2)]  # conlleval chunking
    rc, out = _run(capsys, ["analyse", "mention-overlap", "--train", str(FIX / "ner/bc5cdr_chem_devel_head.tsv"),
                            "--eval", str(FIX / "ner/bc5cdr_disease_devel_head.tsv")])
    stats = out["eval"][str(FIX / "ner/bc5cdr_disease_devel_head.tsv")]
    # chemical mentions never label diseases: nothing of the disease file is "seen" as a Disease
    assert rc == 0 and stats["overall"]["mentions"] > 0 and stats["overall"]["seen_in_train"] == 0
