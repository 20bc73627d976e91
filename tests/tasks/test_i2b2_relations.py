"""i2b2 2010 relations in BLUE's TSV (issue 23 item 1; tasks/i2b2_relations.py) for ``finetune re``: the reader on a
synthetic file in BLUE's exact form (csv-quoted sentence, a pair written once per relation, an overlap marker,
non-ASCII), scoring as BLUE's micro-F1 over the eight types with ``false`` excluded (checked against
scikit-learn), a bad line refused with file and line (exit 2), and a two-step ``finetune re`` end to end."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest
from harness import run_world
from sklearn.metrics import precision_recall_fscore_support

from reliability.cli_log import run_cli
from bio_megatron.evaluation.chemprot import chemprot_scores
from bio_megatron.tasks.i2b2_relations import I2B2_RE_LABELS, I2B2_RE_POSITIVES, read_i2b2_relations

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "clinical" / "i2b2_2010_re"
TINY = ROOT / "nemo_configs" / "re" / "tiny_re.yaml"


def test_blue_relation_tsv_by_hand():
    train = read_i2b2_relations(DATA / "train.tsv")
    assert [e.label for e in train] == ["TrAP", "false", "TeRP", "TrWP", "TrCP", "TrNAP", "PIP", "false"]
    assert train[5].sentence == 'She reported "@problem$" despite @treatment$ .'  # csv's quoting undone
    assert train[3].sentence == train[4].sentence  # one pair, two relations: two examples, as BLUE writes them
    assert "Sjögren" in train[6].sentence and train[7].sentence.startswith("@test-problem$")
    assert train[0].source.endswith("train.tsv:2 (record-13.l1.l2)")
    assert I2B2_RE_LABELS[0] == "false" and len(I2B2_RE_POSITIVES) == 8


def test_score_is_micro_f1_over_the_eight_types_without_false():
    gold = [e.label for e in read_i2b2_relations(DATA / "test.tsv")] * 2
    pred = ["TeRP", "TrAP", "false", "TeCP", "TeCP", "TrIP", "TeCP", "TrAP"]
    got = chemprot_scores(gold, pred, I2B2_RE_POSITIVES)
    p, r, f, _ = precision_recall_fscore_support(gold, pred, labels=list(I2B2_RE_POSITIVES), average="micro",
                                                 zero_division=0)
    assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p, r, f))
    assert got["f1"] == pytest.approx(6 / 13) and got["accuracy"] == 3 / 8  # 3 true positives, 7 predicted, 6 gold
    # and on randomly perturbed predictions over every label of the three files
    gold = [e.label for f in ("train.tsv", "dev.tsv", "test.tsv") for e in read_i2b2_relations(DATA / f)] * 5
    for seed in range(5):
        rng = random.Random(seed)
        pred = [g if rng.random() < 0.5 else rng.choice(I2B2_RE_LABELS) for g in gold]
        got = chemprot_scores(gold, pred, I2B2_RE_POSITIVES)
        p, r, f, _ = precision_recall_fscore_support(gold, pred, labels=list(I2B2_RE_POSITIVES), average="micro",
                                                     zero_division=0)
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p, r, f), abs=1e-12), seed


def test_evaluate_re_scores_i2b2_2010_through_the_cli(tmp_path, capsys):
    """``evaluate re --dataset i2b2_2010`` reads BLUE's TSV as gold and predict re's JSON lines (or ids through the
    model's label map) and equals scikit-learn's micro P/R/F1 over the eight types; ChemProt's default refuses
    i2b2 labels rather than scoring them as negatives."""
    import json

    from bio_megatron.cli import main

    gold = [e.label for f in ("train.tsv", "dev.tsv", "test.tsv") for e in read_i2b2_relations(DATA / f)] * 5
    rows = [f"r{i}\t@problem$ with @treatment$ .\t{g}" for i, g in enumerate(gold)]
    (tmp_path / "gold.tsv").write_text("index\tsentence\tlabel\n" + "\n".join(rows) + "\n")
    rng = random.Random(7)
    pred = [g if rng.random() < 0.5 else rng.choice(I2B2_RE_LABELS) for g in gold]
    (tmp_path / "pred.jsonl").write_text("".join(json.dumps({"label": p, "score": 0.9}) + "\n" for p in pred))
    (tmp_path / "ids.txt").write_text("".join(f"{I2B2_RE_LABELS.index(p)}\n" for p in pred))
    (tmp_path / "label_ids.csv").write_text("".join(f"{label}\n" for label in I2B2_RE_LABELS))
    p, r, f, _ = precision_recall_fscore_support(gold, pred, labels=list(I2B2_RE_POSITIVES), average="micro",
                                                 zero_division=0)
    for extra in (["--pred", str(tmp_path / "pred.jsonl")],
                  ["--pred", str(tmp_path / "ids.txt"), "--label-ids", str(tmp_path / "label_ids.csv")]):
        assert main(["evaluate", "re", "--dataset", "i2b2_2010", "--gold", str(tmp_path / "gold.tsv"), *extra]) == 0
        got = json.loads(capsys.readouterr().out)
        assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p, r, f), abs=1e-12), extra
    # i2b2 labels under ChemProt's default would score as negatives (all zeros): refused, naming the file
    rc, message = run_cli(["evaluate", "re", "--gold", str(tmp_path / "ids.txt"), "--pred", str(tmp_path / "ids.txt"),
                           "--label-ids", str(tmp_path / "label_ids.csv")])
    assert rc == 2 and "label_ids.csv" in message and "--dataset chemprot" in message
    (tmp_path / "names.txt").write_text("\n".join(gold) + "\n")
    rc, message = run_cli(["evaluate", "re", "--gold", str(tmp_path / "names.txt"), "--pred",
                           str(tmp_path / "names.txt")])
    assert rc == 2 and "unknown label" in message and "names.txt:1" in message
    (tmp_path / "cpr.txt").write_text("CPR:3\nfalse\n")
    rc, message = run_cli(["evaluate", "re", "--dataset", "i2b2_2010", "--gold", str(tmp_path / "cpr.txt"),
                           "--pred", str(tmp_path / "cpr.txt")])
    assert rc == 2 and "cpr.txt:1" in message


@pytest.mark.parametrize("line,needle", [
    ("0001.l0.l1\t@test$ revealed @problem$ .\tTrXX", "label 'TrXX' is not one of"),
    ("0001.l0.l1\t@test$ revealed @problem$ .", "2 tab-separated field(s)"),
    ("0001.l0.l1\tnothing marked here .\tfalse", "without BLUE's @<type>$ concept markers"),
])
def test_bad_line_is_refused_with_file_and_line(tmp_path, line, needle):
    lines = (DATA / "dev.tsv").read_text(encoding="utf-8").split("\n")
    lines[2] = line
    (tmp_path / "dev.tsv").write_text("\n".join(lines), encoding="utf-8")
    (tmp_path / "train.tsv").write_bytes((DATA / "train.tsv").read_bytes())
    rc, msg = run_cli(["finetune", "re", "--config", str(TINY), "model.dataset.format=i2b2_2010",
                       f"model.dataset.data_dir={tmp_path}", "model.dataset.train_file=train.tsv",
                       "model.dataset.dev_file=dev.tsv", "trainer.max_steps=1",
                       f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.name=bad"], logging.ERROR, " | ")
    assert rc == 2 and f"{tmp_path / 'dev.tsv'}:3: " in msg and needle in msg and "Traceback" not in msg, msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()  # one line; nothing written


def _finetune(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("re", TINY, over, int(os.environ["WORLD_SIZE"])))


def test_finetune_re_on_i2b2_2010_scores_the_relation_types(tmp_path):
    over = ["model.dataset.format=i2b2_2010", f"model.dataset.data_dir={DATA}", "model.dataset.train_file=train.tsv",
            "model.dataset.dev_file=dev.tsv", "model.dataset.test_file=test.tsv", "trainer.max_steps=2",
            "trainer.val_check_interval=2", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=rel"]
    (res,) = run_world(1, _finetune, over)
    assert set(res["test"]["per_class"]) == set(I2B2_RE_POSITIVES) and res["test"]["support"] == 3


def test_recipe_dry_run_reads_blue_files(capsys):
    import json

    rc, msg = run_cli(["finetune", "re", "--config", str(ROOT / "nemo_configs" / "re" / "i2b2_2010_re.yaml"),
                       "--dry-run", f"model.dataset.data_dir={DATA}"], logging.ERROR, " | ")
    assert rc == 0, msg
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["model"]["dataset"]["format"], cfg["trainer"]["max_epochs"]) == ("i2b2_2010", 5)
