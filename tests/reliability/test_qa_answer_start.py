"""A SQuAD answer whose ``answer_start`` does not point at its text (issue 21, item 3): on main (bb6a95b) it was
logged and trained (on the wrong span, or as "no answer" where it fell outside every window). Now ``finetune qa``
refuses it naming the file, line and question id, or, with ``model.dataset.bad_answer_start=drop``, leaves the
question out and logs the count.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from reliability.cli_log import run_cli

ROOT = Path(__file__).resolve().parents[2]
SQUAD = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"
TINY_QA = str(ROOT / "nemo_configs" / "qa" / "tiny_qa.yaml")


def _squad_with_bad_start(tmp_path: Path) -> tuple[Path, str]:
    data = json.loads(SQUAD.read_text())
    qa = next(q for a in data["data"] for p in a["paragraphs"] for q in p["qas"] if q["answers"])
    qa["answers"][0]["answer_start"] += 1  # off by one
    out = tmp_path / "train.json"
    out.write_text(json.dumps(data, indent=1))
    return out, qa["id"]


def _finetune_qa(argv: list[str]) -> dict:
    """``finetune qa`` in a forked process, with its WARNING and ERROR lines."""
    from harness import run_world

    (res,) = run_world(1, _finetune_child, argv)
    return res


def _finetune_child(argv: list[str]) -> dict:
    os.chdir(ROOT)
    rc, msg = run_cli(argv, level=logging.WARNING, sep="\n")
    return {"rc": rc, "msg": msg}


def _qa_args(tmp_path: Path, train: Path, *over: str) -> list[str]:
    return ["finetune", "qa", "--config", TINY_QA, f"exp_manager.exp_dir={tmp_path / 'runs'}",
            f"model.dataset.data_dir={train.parent}", f"model.dataset.train_file={train.name}",
            f"model.dataset.dev_file={train.name}", "model.dataset.test_file=null", *over]


def test_qa_answer_start_off_by_one_names_file_line_and_id(tmp_path):
    train, qid = _squad_with_bad_start(tmp_path)
    res = _finetune_qa(_qa_args(tmp_path, train))
    line = next(i for i, text in enumerate(train.read_text().splitlines(), 1) if json.dumps(qid) in text)
    assert res["rc"] == 2 and f"{train}:{line}: question {qid}: answer_start" in res["msg"], res
    assert "bad_answer_start=drop" in res["msg"], res


def test_qa_answer_start_off_by_one_dropped_with_a_count_when_chosen(tmp_path):
    train, qid = _squad_with_bad_start(tmp_path)
    res = _finetune_qa(_qa_args(tmp_path, train, "model.dataset.bad_answer_start=drop", "trainer.max_steps=1",
                                "trainer.max_epochs=1", "model.dataset.max_eval_examples=4"))
    assert res["rc"] == 0, res
    assert "1 question(s) dropped" in res["msg"] and qid in res["msg"], res


def test_negative_or_boolean_answer_start_is_refused(tmp_path):
    """``context[-3:]`` would read the end of the context, and ``True`` is an int to Python."""
    from bio_megatron.tasks.qa_data import read_squad
    from bio_megatron.utils.errors import DataError

    for start in (-3, True):
        data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
            {"context": "a cell bcl", "qas": [{"id": "q1", "question": "Which?", "is_impossible": False,
                                               "answers": [{"text": "bcl", "answer_start": start}]}]}]}]}
        path = tmp_path / "train.json"
        path.write_text(json.dumps(data, indent=1))
        with pytest.raises(DataError, match="question q1: answer_start"):
            read_squad(path)
        assert read_squad(path, "drop") == []
