"""``predict re`` (issue 23 item 1: every task has ``predict``): a ``finetune re`` checkpoint on the run's own test
file gives the run's test predictions (``evaluate re`` on its output reproduces the run's test scores, per class
and accuracy included), JSON lines ``{"id", "text"}`` give the same, a line without the entity markers is refused
(one line naming file:line, exit 2, nothing written); the dataset readers and marker rules of each RE format; the
HF folder exported from the run gives the same predictions, and an i2b2-2010 model predicts BLUE's file with BLUE's
indexes as its run scored it (both extended: one more run each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import cli_forked

from bio_megatron.config.finetune_data import ReDatasetConfig
from bio_megatron.predict.re import detect_format, read_examples
from bio_megatron.utils.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
RE_FIXTURES = ROOT / "tests" / "fixtures" / "re"
I2B2 = ROOT / "tests" / "fixtures" / "clinical" / "i2b2_2010_re"
TINY = ROOT / "nemo_configs" / "re" / "tiny_re.yaml"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _cli(*argv: str) -> str:
    done = cli_forked(list(argv), env=OFFLINE)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """One two-step ``finetune re`` on a NeMo tsv of the real ChemProt development abstracts (BLUE's masking,
    positives and negatives alternating), its test split that same file; shared by the tests below."""
    from bio_megatron.tasks.re_data import read_chemprot_original, write_nemo_tsv

    tmp = tmp_path_factory.mktemp("predict_re")
    examples = read_chemprot_original(RE_FIXTURES / "chemprot_development")
    pos, neg = [e for e in examples if e.label != "false"], [e for e in examples if e.label == "false"]
    write_nemo_tsv(tmp / "test.tsv", [e for pair in zip(pos[:12], neg[:12]) for e in pair])
    _cli("finetune", "re", "--config", str(TINY), "model.dataset.format=nemo", f"model.dataset.data_dir={tmp}",
         "model.dataset.train_file=test.tsv", "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv",
         "trainer.max_steps=2", "trainer.val_check_interval=2", f"exp_manager.exp_dir={tmp / 'runs'}",
         "exp_manager.name=re")
    (result,) = json.loads((tmp / "runs" / "re" / "results.json").read_text())["runs"]
    return {"tmp": tmp, "gold": tmp / "test.tsv", "result": result, "checkpoint": result["checkpoint"]}


def _predict(run: dict, source: Path, out: Path) -> list[dict]:
    _cli("predict", "re", "--checkpoint", run["checkpoint"], "--input", str(source), "--out", str(out))
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_predict_on_the_test_file_reproduces_the_run_and_json_lines_give_the_same(run):
    gold, tmp = run["gold"], run["tmp"]
    preds = _predict(run, gold, tmp / "pred.jsonl")
    sentences = [line.split("\t")[0] for line in gold.read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in preds] == [str(i) for i in range(1, len(sentences) + 1)]  # the file's line numbers
    for p in preds:
        probs = p["probabilities"]
        assert list(probs) == ["false", "CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"], probs  # label_ids.csv order
        assert abs(sum(probs.values()) - 1) < 1e-4 and p["label"] == max(probs, key=probs.get)
        assert p["probability"] == probs[p["label"]]
    assert len({json.dumps(p["probabilities"]) for p in preds}) > 1  # each example's own, not one row repeated
    # evaluate re on the output is the run's own test scoring: the same P/R/F1, accuracy and per-class counts
    scored = json.loads(_cli("evaluate", "re", "--gold", str(gold), "--pred", str(tmp / "pred.jsonl")))
    assert scored == run["result"]["test"], (scored, run["result"]["test"])

    lines = tmp / "docs.jsonl"
    lines.write_text("".join(json.dumps({"id": f"s{i}", "text": s}) + "\n" for i, s in enumerate(sentences)),
                     encoding="utf-8")
    again = _predict(run, lines, tmp / "lines.pred.jsonl")
    assert [p["id"] for p in again] == [f"s{i}" for i in range(len(sentences))]
    assert [{**p, "id": None} for p in again] == [{**p, "id": None} for p in preds]


def test_a_line_without_entity_markers_is_refused_in_one_line_and_nothing_written(run):
    bad, out = run["tmp"] / "bad.jsonl", run["tmp"] / "bad.pred.jsonl"
    bad.write_text('{"id": "a", "text": "@CHEMICAL$ inhibits @GENE$ ."}\n{"id": "b", "text": "aspirin inhibits COX-1 ."}\n',
                   encoding="utf-8")
    done = cli_forked(["predict", "re", "--checkpoint", run["checkpoint"], "--input", str(bad), "--out", str(out)],
                      env=OFFLINE)
    msg = done.stderr.strip()
    assert done.returncode == 2 and f"{bad}:2: no entity markers" in msg and "@CHEMICAL$ and @GENE$" in msg, msg
    assert "\n" not in msg and "Traceback" not in msg and not out.exists() and done.stdout == ""


def test_dataset_files_are_read_as_finetune_re_reads_them_with_their_own_ids():
    i2b2 = read_examples(I2B2 / "test.tsv", ReDatasetConfig(format="i2b2_2010"))
    assert [e.id for e in i2b2] == ["0001.l0.l1", "0001.l2.l3", "0001.l4.l5", "0001.l6.l7"]  # BLUE's index column
    assert i2b2[0].sentence == "@test$ revealed @problem$ ."
    original = read_examples(RE_FIXTURES / "chemprot_development", ReDatasetConfig(format="chemprot_original"))
    assert len(original) == 209 and all(e.id.count(":") == 2 for e in original)  # pmid:chemical:gene
    assert original[0].sentence.startswith("Binding of @CHEMICAL$ to @GENE$")
    scibert = read_examples(RE_FIXTURES / "chemprot_scibert_dev_head.jsonl", ReDatasetConfig(format="scibert"))
    assert len(scibert) == 40 and scibert[0].id == "1" and "<< Ang II >>" in scibert[0].sentence  # SciBERT's own
    # an HF folder records no format: recognised from the file
    assert [detect_format(p) for p in (RE_FIXTURES / "chemprot_development", I2B2 / "test.tsv",
                                       RE_FIXTURES / "chemprot_scibert_dev_head.jsonl")] == \
        ["chemprot_original", "i2b2_2010", "scibert"]


@pytest.mark.parametrize("fmt,text,ok", [
    ("i2b2_2010", "@treatment$ improved @problem$ .", True),
    ("i2b2_2010", "@test-problem$ was normal .", True),
    ("i2b2_2010", "@CHEMICAL$ inhibits @GENE$ .", False),     # ChemProt's markers: not what i2b2 training saw
    ("chemprot_original", "@treatment$ improved @problem$ .", False),
    ("chemprot_original", "@CHEMICAL$ only .", False),          # one of the pair
    ("scibert", "<< aspirin >> inhibits [[ COX-1 ]] .", True),
    ("nemo", "<< aspirin >> inhibits [[ COX-1 ]] .", True),     # NeMo tsv: BLUE's or SciBERT's, as converted
    ("nemo", "@CHEM-GENE$ binds .", True),
    (None, "@treatment$ improved @problem$ .", True),            # an HF folder: any format's markers
    (None, "aspirin inhibits COX-1 .", False),
])
def test_json_lines_need_the_markers_of_the_checkpoint_s_format(tmp_path, fmt, text, ok):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": "x", "text": text}) + "\n", encoding="utf-8")
    cfg = ReDatasetConfig(format="nemo")
    cfg.format = fmt
    if ok:
        assert [(e.id, e.sentence) for e in read_examples(path, cfg)] == [("x", text)]
    else:
        with pytest.raises(DataError, match=rf"^{path}:1: no entity markers"):
            read_examples(path, cfg)


def test_evaluate_re_refuses_a_json_line_without_a_label(tmp_path):
    from bio_megatron.evaluation.chemprot import read_label_column

    pred = tmp_path / "pred.jsonl"
    pred.write_text('{"id": "1", "label": "CPR:4"}\n{"id": "2", "probability": 0.5}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{pred}:2: a JSON object without a string \"label\""):
        read_label_column(pred, names=["false", "CPR:4"], ids=False)


@pytest.mark.extended
def test_the_exported_hf_folder_predicts_the_same(run):
    hf = run["tmp"] / "hf"
    _cli("export", "hf", "--checkpoint", run["checkpoint"], "--out", str(hf))
    ours = _predict(run, run["gold"], run["tmp"] / "pred_ckpt.jsonl")
    theirs = _predict({**run, "checkpoint": str(hf)}, run["gold"], run["tmp"] / "pred_hf.jsonl")
    assert [p["label"] for p in theirs] == [p["label"] for p in ours]
    assert all(abs(a["probabilities"][k] - b["probabilities"][k]) < 1e-5
               for a, b in zip(ours, theirs) for k in a["probabilities"])


@pytest.mark.extended
def test_an_i2b2_2010_model_predicts_blue_s_file_as_its_run_scored_it(tmp_path):
    from bio_megatron.evaluation.chemprot import chemprot_scores
    from bio_megatron.tasks.i2b2_relations import I2B2_RE_LABELS, I2B2_RE_POSITIVES, read_i2b2_relations

    _cli("finetune", "re", "--config", str(TINY), "model.dataset.format=i2b2_2010", f"model.dataset.data_dir={I2B2}",
         "model.dataset.train_file=train.tsv", "model.dataset.dev_file=dev.tsv", "model.dataset.test_file=test.tsv",
         "trainer.max_steps=2", "trainer.val_check_interval=2", f"exp_manager.exp_dir={tmp_path}",
         "exp_manager.name=rel")
    (result,) = json.loads((tmp_path / "rel" / "results.json").read_text())["runs"]
    preds = _predict({"checkpoint": result["checkpoint"]}, I2B2 / "test.tsv", tmp_path / "pred.jsonl")
    assert [p["id"] for p in preds] == ["0001.l0.l1", "0001.l2.l3", "0001.l4.l5", "0001.l6.l7"]
    assert all(list(p["probabilities"]) == list(I2B2_RE_LABELS) for p in preds)
    gold = [e.label for e in read_i2b2_relations(I2B2 / "test.tsv")]
    assert chemprot_scores(gold, [p["label"] for p in preds], I2B2_RE_POSITIVES) == result["test"]
