"""The CLI end to end (finetune with --seeds -> results table, export, predict ner/qa) and bad inputs that must
fail through the CLI with file and line, a clean message and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import Ran, cli_forked

ROOT = Path(__file__).resolve().parents[2]
TINY = {t: str(ROOT / "nemo_configs" / t / f"tiny_{t}.yaml") for t in ("ner", "re", "qa")}
ENV = {"OMP_NUM_THREADS": "1"}


def cli(*args: str) -> Ran:
    """``bio-megatron args`` as a process of its own, forked from this one (run from ROOT: the caller chdirs)."""
    return cli_forked(list(args), env=ENV, timeout=300)


def in_process(capsys, *args: str) -> tuple[int, str]:
    """Through ``bio_megatron.cli.main`` in this process: errors surface before any process group exists."""
    import logging

    from bio_megatron.cli import main
    from bio_megatron.utils.log import setup_logging

    logger = logging.getLogger("bio_megatron")
    saved = logger.handlers[:]
    setup_logging(force=True)  # bind the log handler to pytest's captured stderr for this call only
    try:
        rc = main(list(args))
    finally:
        logger.handlers[:] = saved
    return rc, capsys.readouterr().err


def test_finetune_seeds_export_predict(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands ran from the repository root
    run = cli("finetune", "ner", "--config", TINY["ner"], "--seeds", "1,2", "trainer.max_steps=4",
              "trainer.val_check_interval=4", "model.dataset.max_eval_examples=24", f"exp_manager.exp_dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["seeds"] == [1, 2] and summary["test"]["f1"]["n"] == 2
    assert set(summary["test"]["f1"]) == {"mean", "median", "std", "min", "max", "n"}
    table = (tmp_path / "tiny_ner" / "results.md").read_text()
    assert "| tiny_ner | test |" in table and "median" in table
    ckpt = tmp_path / "tiny_ner" / "seed1" / "checkpoints"
    exp = cli("export", "hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"))
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert json.loads(exp.stdout)["class"] == "MegatronBertForTokenClassification"
    docs = tmp_path / "docs.jsonl"
    text = "Cocaine and lidocaine were given. Naloxone reverses clonidine."
    docs.write_text(json.dumps({"id": "d1", "text": text}) + "\n")
    pred = cli("predict", "ner", "--checkpoint", str(ckpt), "--input", str(docs), "--out", str(tmp_path / "ents.jsonl"))
    assert pred.returncode == 0, pred.stderr[-3000:]
    (rec,) = [json.loads(x) for x in (tmp_path / "ents.jsonl").read_text().splitlines()]
    assert rec["id"] == "d1" and isinstance(rec["entities"], list)
    for ent in rec["entities"]:
        assert text[ent["start"]:ent["end"]] == ent["text"] and ent["type"] == "Chemical"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["length_mismatch", "unknown_tag", "unknown_dev_tag", "broken_json_re",
                                  "question_without_context"])
def test_bad_training_inputs_name_file_and_line(tmp_path, capsys, case):
    common = [f"exp_manager.exp_dir={tmp_path}", f"model.dataset.data_dir={tmp_path}", "model.dataset.test_file=null"]
    good = "Cocaine\tB-Chemical\ninduced\tO\n\n"
    if case == "length_mismatch":
        _write(tmp_path / "text_train.txt", "Cocaine induced seizures\nNaloxone works\n")
        _write(tmp_path / "labels_train.txt", "B-Chemical O O\nB-Chemical\n")
        args = ["ner", "model.dataset.format=nemo", "model.dataset.train_file=text_train.txt",
                "model.dataset.dev_file=text_train.txt"]
        where, what = "text_train.txt:2:", "2 words but 1 labels"
    elif case == "unknown_tag":
        _write(tmp_path / "train.tsv", good + "Naloxone\tChemical\n")
        args = ["ner", "model.dataset.train_file=train.tsv", "model.dataset.dev_file=train.tsv"]
        where, what = "train.tsv:4:", "unknown tag 'Chemical'"
    elif case == "unknown_dev_tag":
        _write(tmp_path / "train.tsv", good)
        _write(tmp_path / "dev.tsv", good + "aspirin\tB-Drug\n")
        args = ["ner", "model.dataset.train_file=train.tsv", "model.dataset.dev_file=dev.tsv"]
        where, what = "dev.tsv:4:", "unknown tag 'B-Drug'"
    elif case == "broken_json_re":
        _write(tmp_path / "train.jsonl", '{"text": "<< a >> [[ b ]]", "label": "INHIBITOR"}\n{"text": "x", "label"\n')
        args = ["re", "model.dataset.train_file=train.jsonl", "model.dataset.dev_file=train.jsonl"]
        where, what = "train.jsonl:2:", "broken JSON"
    else:
        data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
            {"context": "", "qas": [{"id": "q1", "question": "Why?", "answers": [], "is_impossible": True}]}]}]}
        _write(tmp_path / "train.json", json.dumps(data, indent=1))
        args = ["qa", "model.dataset.train_file=train.json", "model.dataset.dev_file=train.json"]
        where, what = "train.json:", 'no "context"'
    task, *over = args
    rc, err = in_process(capsys, "finetune", task, "--config", TINY[task], *common, *over)
    assert rc == 2
    assert where in err and what in err, err
    assert "Traceback" not in err


def test_bad_prediction_inputs_name_file_and_line(tmp_path, capsys):
    docs = _write(tmp_path / "docs.jsonl", '{"id": 1, "text": "fine"}\n{"id": 2, "text": "broken"\n')
    rc, err = in_process(capsys, "predict", "ner", "--checkpoint", str(tmp_path / "none"), "--input", str(docs))
    assert rc == 2 and "docs.jsonl:2: broken JSON" in err, err
    qs = _write(tmp_path / "qs.jsonl", '{"id": "a", "question": "Q?", "context": "C."}\n{"id": "b", "question": "Q?"}\n')
    rc, err = in_process(capsys, "predict", "qa", "--checkpoint", str(tmp_path / "none"), "--input", str(qs))
    assert rc == 2 and "qs.jsonl:2:" in err and "no \"context\"" in err, err
