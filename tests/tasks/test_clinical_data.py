"""The clinical readers on synthetic files in the releases' exact formats (tests/fixtures/clinical: MedNLI's
``mli_*_v1.jsonl``, n2c2 ClinicalSTS's ``clinicalSTS2019.*.txt``): counts and fields by hand, bad input refused
with file and line (exit 2, nothing printed), and ``finetune classify`` on them end to end with ``evaluate``
reproducing the reported test score, ``predict classify`` its predictions and the ``export hf`` folder, read by
transformers' Auto classes and tokenizer alone, the same outputs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from harness import run_world

from reliability.cli_log import run_cli
from bio_megatron.tasks.clinical_data import MEDNLI_LABELS, read_clinicalsts, read_mednli
from bio_megatron.utils.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "clinical"
MEDNLI = FIX / "mednli"
STS = FIX / "clinicalsts"


def test_mednli_reader_counts_fields_and_ids():
    train = read_mednli(MEDNLI / "mli_train_v1.jsonl")
    assert len(train) == 12 and [e.label for e in train[:3]] == ["entailment", "contradiction", "neutral"]
    assert sorted(sum(e.label == lab for e in train) for lab in MEDNLI_LABELS) == [4, 4, 4]
    first = train[0]  # the parse fields of the release are ignored; pairID is the id
    assert (first.id, first.text, first.text_b) == ("a0000001-0000-11e7-a8dc-f45c89b91419",
                                                    "Patient denies chest pain or shortness of breath.",
                                                    "The patient has no chest pain.")
    assert train[3].text == "Temperature 38.9 °C on admission, WBC 14.2."  # non-ASCII kept
    assert len(read_mednli(MEDNLI / "mli_dev_v1.jsonl")) == 6 and len(read_mednli(MEDNLI / "mli_test_v1.jsonl")) == 6


def test_clinicalsts_reader_counts_scores_and_line_ids():
    train = read_clinicalsts(STS / "clinicalSTS2019.train.txt")
    assert len(train) == 8 and [e.score for e in train] == [4.5, 5.0, 1.5, 0.0, 3.5, 2.0, 3.75, 1.0]
    assert [e.id for e in train] == [str(i) for i in range(1, 9)]
    assert (train[6].text, train[6].text_b) == ("Temperature 38.9 °C on admission.", "Febrile on arrival.")


def test_clinicalsts_test_release_reads_scores_from_gs_sim_file():
    test = read_clinicalsts(STS / "clinicalSTS2019.test.txt")  # pairs only; scores in .test.gs.sim.txt beside it
    assert [e.score for e in test] == [4.0, 4.75, 0.25, 3.0, 1.0] and [e.id for e in test] == ["1", "2", "3", "4", "5"]
    assert (test[1].text, test[1].text_b) == ("Metoprolol 25 mg twice daily.", "Metoprolol tartrate 25 mg PO BID.")


@pytest.mark.parametrize("scores,needles", [
    (None, ("clinicalSTS2019.test.gs.sim.txt beside it, which is missing",)),
    ("4.0\n4.75\n0.25\n3.0\n", ("4 scores for the 5 pairs",)),
    ("4.0\n4.75\nnan\n3.0\n1.0\n", ("clinicalSTS2019.test.gs.sim.txt:3:", "'nan' is not a number in [0, 5]")),
])
def test_clinicalsts_test_release_refuses_missing_or_bad_scores(capsys, tmp_path, scores, needles):
    gold = tmp_path / "clinicalSTS2019.test.txt"
    gold.write_text((STS / "clinicalSTS2019.test.txt").read_text(encoding="utf-8"), encoding="utf-8")
    if scores is not None:
        (tmp_path / "clinicalSTS2019.test.gs.sim.txt").write_text(scores)
    rc, out, msg = _run(capsys, ["evaluate", "clinicalsts", "--gold", str(gold),
                                 "--pred", str(STS / "clinicalSTS2019.test.pred.jsonl")])
    assert (rc, out) == (2, "") and "Traceback" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc, msg = run_cli(argv, logging.WARNING, " | ")
    return rc, capsys.readouterr().out, msg


def _with_line(src: Path, dst: Path, index: int, line: str) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()
    lines[index] = line
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


@pytest.mark.parametrize("task,index,line,needles", [
    ("mednli", 2, '{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"', (":3:", "broken JSON")),
    ("mednli", 1, '{"sentence1": "a", "sentence2": "b", "gold_label": "Entailment", "pairID": "x"}',
     (":2:", "gold_label 'Entailment' is not one of")),
    ("mednli", 4, '{"sentence1": "a", "gold_label": "neutral", "pairID": "x"}', (":5:", '"sentence2"')),
    ("mednli", 3, '{"sentence1": "a", "sentence2": "b", "gold_label": "neutral", '
                  '"pairID": "t0000001-0000-11e7-a8dc-f45c89b91419"}', (":4:", "already used on line 1")),
    ("clinicalsts", 1, "one sentence\t4.0", (":2:", "2 tab-separated field(s)")),
    ("clinicalsts", 1, "a\tb\t4.0\textra", (":2:", "4 tab-separated field(s)")),
    ("clinicalsts", 2, "a\tb\t5.5", (":3:", "not a number in [0, 5]")),
    ("clinicalsts", 0, "a\tb\thigh", (":1:", "'high' is not a number")),
])
def test_bad_gold_line_is_refused_with_file_and_line(capsys, tmp_path, task, index, line, needles):
    gold_src, pred = {"mednli": (MEDNLI / "mli_test_v1.jsonl", MEDNLI / "mli_test_v1.pred.jsonl"),
                      "clinicalsts": (STS / "clinicalSTS2019.train.txt",
                                      STS / "clinicalSTS2019.test.pred.jsonl")}[task]
    gold = _with_line(gold_src, tmp_path / gold_src.name, index, line)
    out_json = tmp_path / "score.json"
    rc, out, msg = _run(capsys, ["evaluate", task, "--gold", str(gold), "--pred", str(pred),
                                 "--json", str(out_json)])
    assert (rc, out) == (2, "") and not out_json.exists(), "a score was written for bad input"
    assert f"{gold}:" in msg and "Traceback" not in msg and "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_bad_prediction_label_is_refused(capsys, tmp_path):
    pred = _with_line(MEDNLI / "mli_test_v1.pred.jsonl", tmp_path / "p.jsonl", 1,
                      '{"id": "t0000001-0000-11e7-a8dc-f45c89b91420", "label": "contradict"}')
    rc, out, msg = _run(capsys, ["evaluate", "mednli", "--gold", str(MEDNLI / "mli_test_v1.jsonl"),
                                 "--pred", str(pred)])
    assert (rc, out) == (2, "") and f"{pred}:2:" in msg and "is not one of" in msg


def test_readers_refuse_empty_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no pairs"):
        read_mednli(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no pairs"):
        read_clinicalsts(tmp_path / "empty.jsonl")


# --- finetune classify on the clinical formats -------------------------------------------------------------
RECIPE = ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"
QUICK = ["trainer.max_steps=60", "trainer.val_check_interval=60", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "model.classifier_head.fc_dropout=0.0", "model.optim.lr=1e-3"]
FILES = {"mednli": (MEDNLI, "mli_{}_v1.jsonl"), "clinicalsts": (STS, "clinicalSTS2019.{}.txt")}


def _finetune(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("classify", RECIPE, over, int(os.environ["WORLD_SIZE"])))


@pytest.mark.parametrize("task_name", list(FILES))
def test_finetune_classify_on_clinical_format_and_evaluate_reproduces_test_score(tmp_path, capsys, task_name):
    from bio_megatron.cli import main

    folder, pattern = FILES[task_name]
    over = QUICK + [f"model.dataset.task_name={task_name}", f"model.dataset.data_dir={folder}",
                    f"model.dataset.train_file={pattern.format('train')}",
                    f"model.dataset.dev_file={pattern.format('train')}",
                    f"model.dataset.test_file={pattern.format('train')}",
                    f"exp_manager.exp_dir={tmp_path}", f"exp_manager.name={task_name}"]
    (res,) = run_world(1, _finetune, over)
    losses = [h["loss"] for h in res["history"] if "loss" in h]
    # train = dev = test (as tiny_classify): the tiny encoder memorises the pairs, which shows that the reader's
    # premise, hypothesis and target reach the model
    assert len(losses) == 60 and sum(losses[-5:]) / 5 < 0.7 * losses[0], losses
    assert res["test"]["metric"] == {"mednli": "accuracy", "clinicalsts": "pearson"}[task_name]
    capsys.readouterr()
    gold = folder / pattern.format("train")
    assert main(["evaluate", task_name, "--gold", str(gold), "--pred", res["test_predictions"]]) == 0
    assert json.loads(capsys.readouterr().out) == res["test"]
    # predict classify reads the release file (MedNLI's .jsonl, ClinicalSTS's .txt) as training did
    (out,) = run_world(1, _predict_and_export, res["checkpoint"], str(gold), str(tmp_path / "pred.jsonl"),
                       str(tmp_path / "hf"), task_name)
    written = [json.loads(x) for x in Path(res["test_predictions"]).read_text().splitlines()]
    predicted = [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert out["rc"] == (0, 0) and [p["id"] for p in predicted] == [w["id"] for w in written]
    if task_name == "mednli":
        assert [p["label"] for p in predicted] == [w["label"] for w in written]
    else:  # a score up to batch-composition rounding
        assert max(abs(p["score"] - w["score"]) for p, w in zip(predicted, written)) < 1e-5
    # export hf: transformers' own class and tokenizer on the exported folder give what predict gave
    assert out["problem_type"] == {"mednli": "single_label_classification", "clinicalsts": "regression"}[task_name]
    if task_name == "mednli":
        assert out["id2label"] == list(predicted[0]["probabilities"]) and len(out["id2label"]) == 3
        for p, row in zip(predicted, out["outputs"], strict=True):
            assert list(p["probabilities"].values()) == pytest.approx(row, abs=1e-4), (p, row)
    else:
        # the tiny model's scores differ by about 1e-4 from pair to pair: a tolerance ten times finer
        assert [p["score"] for p in predicted] == pytest.approx(out["outputs"], abs=1e-5)


def _predict_and_export(ckpt: str, gold: str, out: str, hf_dir: str, task_name: str) -> dict:
    """``predict classify`` and ``export hf`` through the CLI, then the exported folder's outputs on the gold pairs
    (softmax probabilities, or the regression score) by transformers' Auto classes alone."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from bio_megatron.cli import main

    rc = (main(["predict", "classify", "--checkpoint", ckpt, "--input", gold, "--out", out]),
          main(["export", "hf", "--checkpoint", ckpt, "--out", hf_dir]))
    if task_name == "mednli":
        pairs = [(r["sentence1"], r["sentence2"]) for r in map(json.loads, Path(gold).read_text().splitlines())]
    else:
        pairs = [tuple(line.split("\t")[:2]) for line in Path(gold).read_text(encoding="utf-8").splitlines()]
    tok, model = AutoTokenizer.from_pretrained(hf_dir), AutoModelForSequenceClassification.from_pretrained(hf_dir)
    batch = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**batch).logits
    c = model.config
    rows = logits.softmax(-1).tolist() if task_name == "mednli" else logits[:, 0].tolist()
    return {"rc": rc, "problem_type": c.problem_type, "id2label": [c.id2label[i] for i in range(c.num_labels)],
            "outputs": rows}


# --- BLUE's 4-column NER files (model.dataset.format: blue) -------------------------------------------------
BLUE_NER = FIX / "blue_ner"
NER_RECIPE = ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml"


def test_blue_ner_reader_unquotes_csv_tokens_and_keeps_sentences():
    from bio_megatron.tasks.blue_ner import read_blue_ner

    sentences = read_blue_ner(BLUE_NER / "train.tsv")
    assert [len(s.words) for s in sentences] == [8, 14, 6]
    second = sentences[1]  # a quoted double quote (csv's four quotes) is the token ", non-ASCII kept
    assert second.words[:6] == ["In", '"', "alpha", "-", "methyldopa", '"'] and second.words[8] == "β"
    assert second.tags == ["O", "O", "B", "I", "I", "O", "O", "O", "B", "I", "I", "O", "O", "O"]
    assert sum(t == "B" for s in sentences for t in s.tags) == 6  # mentions, counted by hand


@pytest.mark.parametrize("index,line,needles", [
    (2, "the\t-\t18", ("3 tab-separated field(s)",)),
    (2, "the\t-\teighteen\tO", ("offset 'eighteen' is not an integer",)),
    (2, "the\t-\t5\tO", ("offset 5 is not after the previous token's (9)",)),
    (2, "the\t-\t18\tB-Chemical", ("unknown tag 'B-Chemical'",)),  # the training label set is B, I, O
    (9, "In\t-\t60\tO", ("first token has no document id",)),
    (10, '"a\t-\t63\tO', ("does not parse",)),
])
def test_finetune_ner_blue_refuses_a_bad_line_with_file_and_line(tmp_path, index, line, needles):
    data = tmp_path / "data"
    data.mkdir()
    lines = (BLUE_NER / "train.tsv").read_text(encoding="utf-8").split("\n")
    (data / "train.tsv").write_text((BLUE_NER / "train.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    lines[index] = line
    (data / "test.tsv").write_text("\n".join(lines), encoding="utf-8")
    rc, msg = run_cli(["finetune", "ner", "--config", str(NER_RECIPE), "model.dataset.format=blue",
                       f"model.dataset.data_dir={data}", "model.dataset.train_file=train.tsv",
                       "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv",
                       "trainer.max_steps=2", f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.name=bad"],
                      logging.ERROR, " | ")
    assert rc == 2 and f"{data / 'test.tsv'}:{index + 1}:" in msg and "Traceback" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def _finetune_ner(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("ner", NER_RECIPE, over, int(os.environ["WORLD_SIZE"])))


def test_finetune_ner_on_blue_format_learns_and_scores_untyped_entities(tmp_path):
    over = ["model.dataset.format=blue", f"model.dataset.data_dir={BLUE_NER}", "model.dataset.train_file=train.tsv",
            "model.dataset.dev_file=devel.tsv", "model.dataset.test_file=test.tsv", "trainer.max_steps=30",
            "trainer.val_check_interval=30", "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
            f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=blue"]
    (res,) = run_world(1, _finetune_ner, over)
    losses = [h["loss"] for h in res["history"] if "loss" in h]
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0], losses
    labels = (tmp_path / "blue").rglob("label_ids.csv")
    assert [p.read_text().split() for p in labels][0] == ["O", "B", "I"]  # BLUE's untyped tags, pad label first


def test_bc5cdr_blue_recipe_resolves_with_bio_lm_protocol(capsys):
    recipe = ROOT / "nemo_configs" / "ner" / "bc5cdr_chem_blue.yaml"
    rc, msg = run_cli(["finetune", "ner", "--config", str(recipe), "--dry-run", f"model.dataset.data_dir={BLUE_NER}",
                       "model.dataset.dev_file=devel.tsv"], logging.ERROR, " | ")
    assert rc == 0, msg
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert cfg["model"]["dataset"]["format"] == "blue" and cfg["model"]["optim"]["lr"] == 1e-5
    assert (cfg["trainer"]["max_epochs"], cfg["trainer"]["val_check_interval"]) == (20, 500)
