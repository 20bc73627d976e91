"""GAD / EU-ADR as BioBERT's ten folds (issue 23 item 1; tasks/folds.py): ``model.dataset.fold: N`` reads
``<data_dir>/<N>/train.tsv, test.tsv`` in BioBERT's layout (train without a header, test with ``index sentence
label``), on a synthetic two-fold EU-ADR folder (tests/fixtures/clinical/folds). A fold folder that is missing or a
label outside 0/1 is one line naming the file (and line), exit 2, nothing trained."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from bio_megatron.config.finetune import load_finetune_config
from bio_megatron.tasks.classify_data import dataset
from bio_megatron.tasks.folds import read_biobert_fold
from bio_megatron.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EUADR = ROOT / "tests" / "fixtures" / "clinical" / "folds" / "euadr"
RECIPE = ROOT / "nemo_configs" / "classify" / "euadr.yaml"
TINY = ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"


def test_fold_files_in_both_of_biobert_forms():
    train = read_biobert_fold(EUADR / "1" / "train.tsv")  # no header: sentence<TAB>label
    assert [e.label for e in train] == ["1", "0", "1", "0"] and train[2].id == "3"
    assert "Ca²⁺" in train[2].text and train[0].text.startswith("The @GENE$ variant")
    test = read_biobert_fold(EUADR / "2" / "test.tsv")  # header, then index<TAB>sentence<TAB>label
    assert [(e.id, e.label) for e in test] == [("0", "1"), ("1", "0"), ("2", "1")]
    examples = dataset("euadr").examples(EUADR / "2" / "test.tsv", fold=True)
    assert [e.target for e in examples] == [1, 0, 1]  # ids of GAD's labels 0, 1


def test_fold_key_reads_every_split_inside_the_fold_and_is_idempotent():
    over = [f"model.dataset.data_dir={EUADR}", "model.dataset.fold=2"]
    cfg = load_finetune_config("classify", RECIPE, over, world_size=1)
    d = cfg.model.dataset
    assert (d.task_name, d.train_file, d.dev_file, d.test_file) == ("euadr", "2/train.tsv", "2/test.tsv", "2/test.tsv")
    again = load_finetune_config("classify", RECIPE, over + [f"model.dataset.train_file={d.train_file}"], 1)
    assert again.model.dataset.train_file == "2/train.tsv"  # a resolved config loads to the same files
    other = load_finetune_config("classify", RECIPE, over[:1] + ["model.dataset.fold=1",
                                                                 "model.dataset.dev_file=2/test.tsv"], 1)
    assert other.model.dataset.dev_file == "1/test.tsv"  # another fold's resolved file name moves to this fold


@pytest.mark.parametrize("over,needle", [
    (["model.dataset.fold=11"], "model.dataset.fold (11) is one of BioBERT's ten folds 1..10"),
    (["model.dataset.fold=null"], "euadr exists only as BioBERT's ten folds"),
    (["model.dataset.task_name=hoc", "model.dataset.fold=2"], "(task_name is hoc)"),
])
def test_bad_fold_settings_are_config_errors(over, needle):
    with pytest.raises(ConfigError) as exc:
        load_finetune_config("classify", RECIPE, [f"model.dataset.data_dir={EUADR}"] + over, world_size=1)
    assert needle in str(exc.value)


def test_recipe_dry_run_reads_the_fold(capsys):
    rc, msg = run_cli(["finetune", "classify", "--config", str(RECIPE), "--dry-run", f"model.dataset.data_dir={EUADR}"],
                      logging.ERROR, " | ")
    assert rc == 0, msg
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert cfg["model"]["dataset"]["fold"] == 1 and cfg["model"]["dataset"]["train_file"] == "1/train.tsv"


def _finetune(tmp_path: Path, data: Path, fold: int) -> tuple[int, str]:
    return run_cli(["finetune", "classify", "--config", str(TINY), "model.dataset.task_name=euadr",
                    f"model.dataset.fold={fold}", f"model.dataset.data_dir={data}",
                    "model.dataset.train_file=train.tsv",
                    "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv", "trainer.max_steps=1",
                    f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.name=fold"], logging.ERROR, " | ")


def test_a_missing_fold_folder_is_named(tmp_path):
    rc, msg = _finetune(tmp_path, EUADR, 3)
    assert rc == 2 and f"{EUADR / '3'}: fold folder not found" in msg and "Traceback" not in msg, msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()  # one line; nothing written


def test_a_label_outside_the_set_is_refused_with_file_and_line(tmp_path):
    data = tmp_path / "euadr"
    for fold in ("1", "2"):
        (data / fold).mkdir(parents=True)
        for name in ("train.tsv", "test.tsv"):
            (data / fold / name).write_bytes((EUADR / fold / name).read_bytes())
    bad = data / "2" / "test.tsv"
    bad.write_text(bad.read_text(encoding="utf-8").replace("studied .\t0", "studied .\tfalse"), encoding="utf-8")
    rc, msg = _finetune(tmp_path, data, 2)
    assert rc == 2 and f"{bad}:3: label 'false' is not one of ['0', '1']" in msg, msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()  # one line; nothing written


def _finetune_rank(over: list[str]) -> dict:
    import os

    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("classify", TINY, over, int(os.environ["WORLD_SIZE"])))


def test_a_folds_test_predictions_score_with_evaluate_gad_on_its_test_file(tmp_path, capsys):
    from harness import run_world

    from bio_megatron.cli import main

    over = ["model.dataset.task_name=euadr", "model.dataset.fold=2", f"model.dataset.data_dir={EUADR}",
            "model.dataset.train_file=train.tsv", "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv",
            "trainer.max_steps=2", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=euadr"]
    (res,) = run_world(1, _finetune_rank, over)
    capsys.readouterr()
    assert main(["evaluate", "gad", "--gold", str(EUADR / "2" / "test.tsv"), "--pred", res["test_predictions"]]) == 0
    scored = json.loads(capsys.readouterr().out)  # the fold's ids are its test file's index column
    assert {**scored, "task": "euadr"} == res["test"] and scored["total"] == 3
    # predict classify reads the fold's test file (BioBERT's indexed form) as training did: the same predictions
    (rc,) = run_world(1, _predict, res["checkpoint"], str(EUADR / "2" / "test.tsv"), str(tmp_path / "pred.jsonl"))
    written = [json.loads(x) for x in Path(res["test_predictions"]).read_text().splitlines()]
    predicted = [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert rc == 0 and [(p["id"], p["label"]) for p in predicted] == [(w["id"], w["label"]) for w in written]


def _predict(ckpt: str, gold: str, out: str) -> int:
    from bio_megatron.cli import main

    return main(["predict", "classify", "--checkpoint", ckpt, "--input", gold, "--out", out])
