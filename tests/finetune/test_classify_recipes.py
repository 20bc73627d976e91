"""Every BLURB classify recipe loads and validates and names data files that the BLURB readers accept (real
files from ../shared, skipped when absent); BioASQ yes/no and EBM PICO, which ../shared cannot hold, ask for
the user's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.config.finetune import load_finetune_config
from bio_megatron.utils.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p for p in (ROOT / "nemo_configs" / "classify").glob("*.yaml")
                 if p.stem not in ("_base", "bioasq_yesno"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_and_its_splits_read(path, monkeypatch):
    from bio_megatron.tasks.classify_data import dataset

    monkeypatch.chdir(ROOT)  # recipes name their data relative to the checkout
    cfg = load_finetune_config("classify", path, world_size=1)
    d = cfg.model.dataset
    assert cfg.task == "classify" and (path.stem.startswith("tiny") or d.task_name == path.stem.removesuffix("_folds"))
    data_dir = Path(d.data_dir)
    if not data_dir.is_dir():
        pytest.skip(f"{data_dir} not found")
    sizes = [len(dataset(d.task_name).examples(data_dir / f)) for f in (d.train_file, d.dev_file, d.test_file)]
    assert min(sizes) > 0, sizes


def test_bioasq_yesno_asks_for_the_users_files():
    with pytest.raises(ConfigError) as exc:
        load_finetune_config("classify", ROOT / "nemo_configs" / "classify" / "bioasq_yesno.yaml", world_size=1)
    for key in ("data_dir", "train_file", "dev_file", "test_file"):
        assert f"model.dataset.{key} is mandatory" in str(exc.value)
    over = [f"model.dataset.data_dir={ROOT / 'tests' / 'fixtures' / 'blurb' / 'BioASQ'}"] + \
        [f"model.dataset.{k}=yesno_golden.json" for k in ("train_file", "dev_file", "test_file")]
    cfg = load_finetune_config("classify", ROOT / "nemo_configs" / "classify" / "bioasq_yesno.yaml", over, 1)
    from bio_megatron.tasks.classify_data import dataset

    examples = dataset("bioasq_yesno").examples(Path(cfg.model.dataset.data_dir) / cfg.model.dataset.train_file)
    assert {e.target for e in examples} == {0, 1} and all(e.text_b for e in examples)


def test_bad_classify_settings_are_reported_together():
    with pytest.raises(ConfigError) as exc:
        load_finetune_config("classify", ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml",
                             ["model.dataset.task_name=biosses", "model.dataset.class_balancing=weighted_loss",
                              "model.dataset.pubmedqa_long_answer=true", "model.dataset.max_seq_length=4"])
    msg = str(exc.value)
    assert "class_balancing (weighted_loss)" in msg and "regression" in msg and "max_seq_length (4)" in msg
    assert "pubmedqa_long_answer" in msg
    with pytest.raises(ConfigError, match="task_name"):
        load_finetune_config("classify", ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml",
                             ["model.dataset.task_name=chemprot"])


def test_ebm_pico_recipe_needs_a_train_file_that_shared_does_not_have(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / "ebm_pico.yaml", world_size=1)
    d = cfg.model.dataset
    if not Path(d.data_dir).is_dir():
        pytest.skip(f"{d.data_dir} not found")
    from bio_megatron.tasks.ner import read_split

    assert not (Path(d.data_dir) / d.train_file).exists()
    with pytest.raises(DataError, match="train.tsv"):
        read_split(d, d.train_file)
    tags = {t for s in read_split(d, d.dev_file) for t in s.tags}
    assert tags == {"O", "I-PAR", "I-INT", "I-OUT"}  # the NER head's label map takes them unchanged


# task_name -> (gold file our reader trains on, gold file `evaluate` reads, the fixture's prediction file)
_SCORED = {"pubmedqa": ("PubMedQA/test_set.json", "PubMedQA/test_ground_truth.json", "PubMedQA/test.pred.jsonl"),
           "bioasq_yesno": ("BioASQ/yesno_golden.json", "BioASQ/yesno_golden.json", "BioASQ/yesno.pred.jsonl"),
           "ddi": ("DDI/test.tsv", "DDI/test.tsv", "DDI/test.pred.jsonl"),
           "gad": ("GAD/test.tsv", "GAD/test.tsv", "GAD/test.pred.jsonl"),
           "biosses": ("BIOSSES/test.tsv", "BIOSSES/test.tsv", "BIOSSES/test.pred.jsonl"),
           "hoc": ("HoC/test.tsv", "HoC/test.tsv", "HoC/test.pred.jsonl")}


@pytest.mark.parametrize("task_name", list(_SCORED))
def test_training_scores_each_dataset_as_evaluate_does(task_name, tmp_path):
    """The score a run reports (model outputs -> the dataset's metric) equals `evaluate <task_name>` on the same
    predictions, for every dataset: label order, positive classes and HoC's grouping agree."""
    import json

    from bio_megatron.tasks.blurb_scoring import EVALUATORS
    from bio_megatron.evaluation.blurb import as_dict
    from bio_megatron.tasks.classify_data import dataset

    fixtures = ROOT / "tests" / "fixtures" / "blurb"
    ours, theirs, pred = (fixtures / f for f in _SCORED[task_name])
    data = dataset(task_name)
    examples = data.examples(ours)
    given = {str(r["id"]): r for r in map(json.loads, pred.read_text().splitlines())}
    outputs = []
    for e in examples:  # the prediction file's values in the model's output space
        r = given[e.id]
        if data.mode == "single":
            outputs.append(data.labels.index(str(r["label"])))
        elif data.mode == "regression":
            outputs.append(r["score"])
        else:
            outputs.append([v if isinstance(v, int) else data.labels.index(v) for v in r["labels"]])
    reported = as_dict(data.score(examples, outputs), task_name)
    assert reported == as_dict(EVALUATORS[task_name].score(str(theirs), str(pred)), task_name)
    written = tmp_path / "pred.jsonl"  # what a run writes for these outputs scores the same again
    written.write_text("".join(json.dumps(data.prediction(e.id, o)) + "\n" for e, o in zip(examples, outputs)))
    assert as_dict(EVALUATORS[task_name].score(str(theirs), str(written)), task_name) == reported
