"""SQuAD -> BioASQ factoid from the recipes' own defaults (the path `finetune qa --config squad_v1` writes is
the one `bioasq_factoid` restores), without test leakage: the checkpoint is chosen on a dev split carved from
the training questions, and the test and golden files are unreadable (not JSON) until training is over and
the loop announces the test scoring. The SQuAD head (and its shape) is kept; scores are the BioASQ factoid
measures over pooled snippets."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from ft_runs import ROOT
from harness import run_world

SLICE = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"
QA = ROOT / "nemo_configs" / "qa"
# the CPU-sized model and schedule; everything else (head, lr schedule, paths, chain) is the recipes'
TINY = ["model.size=tiny", "model.max_position_embeddings=128", "model.dataset.max_seq_length=128",
        "model.dataset.doc_stride=64", "model.dataset.max_query_length=32", "model.micro_batch_size=4",
        "model.global_batch_size=8", "model.fc_hidden_size=null", "trainer.precision=32", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "model.optim.lr=1.0e-3", "model.dataset.max_eval_examples=12"]
NOT_JSON = "not readable before training is over\n"


def _bioasq_files(tmp: Path) -> dict[str, str]:
    """The real SQuAD slice as BioASQ data: answerable questions only, two snippets per training question
    (ids ``<qid>_001``, ``<qid>_002``), one question repeated under another id (a later year's copy), and
    the last six questions as the test batch with its golden JSON. Returns file name -> text."""
    data = json.loads(SLICE.read_text())
    qas = [(p["context"], q) for a in data["data"] for p in a["paragraphs"] for q in p["qas"] if q.get("answers")]
    train_qas, test_qas = qas[:-6], qas[-6:]

    def snippet(context: str, q: dict, sid: str) -> dict:
        return {"context": context, "qas": [{"id": sid, "question": q["question"], "answers": q["answers"]}]}

    train = [snippet(c, q, f"{q['id']}_{k:03d}") for c, q in train_qas for k in (1, 2)]
    train.append(snippet(train_qas[0][0], train_qas[0][1], "repeated0000000000000000_001"))
    test = [snippet(c, q, f"{q['id']}_001") for c, q in test_qas]
    golden = [{"id": q["id"], "type": "factoid", "exact_answer": [[a["text"] for a in q["answers"]]]}
              for _, q in test_qas]
    return {"train.json": json.dumps({"version": "BioASQ7b", "data": [{"title": "t", "paragraphs": train}]}),
            "test.json": json.dumps({"version": "BioASQ7b", "data": [{"title": "t", "paragraphs": test}]}),
            "golden.json": json.dumps({"questions": golden})}


class _RevealAfterTraining(logging.Handler):
    """Writes the real test/golden files when the loop logs that training is done and test scoring starts;
    until then they are not JSON, so reading either during training or selection fails the run."""

    def __init__(self, files: dict[Path, str], run_dir: Path):
        super().__init__()
        self.files, self.run_dir, self.seen = files, run_dir, []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("training done: scoring"):
            for path, text in self.files.items():
                path.write_text(text)
            self.seen.append(sorted(p.name for p in (self.run_dir / "checkpoints").iterdir()))


def _finetune_cli(recipe: str, over: list[str], reveal: dict | None = None) -> dict:
    """What `bio-megatron finetune qa --config <recipe> key=value ...` runs (sweep over the default seed)."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.sweep import run_sweep

    os.chdir(ROOT)
    cfg = load_finetune_config("qa", QA / f"{recipe}.yaml", over, int(os.environ["WORLD_SIZE"]))
    handler = None
    if reveal is not None:
        handler = _RevealAfterTraining(reveal, cfg.run_dir / f"seed{cfg.trainer.seed}")
        logging.getLogger("bio_megatron.tasks.finetune").addHandler(handler)
    summary = run_sweep(cfg)
    summary["restore_from_path"] = cfg.model.restore_from_path
    summary["revealed"] = handler.seen if handler else None
    return summary


def test_squad_then_bioasq_from_the_defaults_without_reading_test(tmp_path):
    run_world(1, _finetune_cli, "squad_v1", TINY + [
        f"exp_manager.exp_dir={tmp_path}", f"model.dataset.data_dir={SLICE.parent}",
        f"model.dataset.train_file={SLICE.name}", f"model.dataset.dev_file={SLICE.name}",
        "model.head.num_fc_layers=1"])
    files = _bioasq_files(tmp_path)
    (tmp_path / "train.json").write_text(files["train.json"])
    for name in ("test.json", "golden.json"):
        (tmp_path / name).write_text(NOT_JSON)
    reveal = {tmp_path / name: files[name] for name in ("test.json", "golden.json")}
    (res,) = run_world(1, _finetune_cli, "bioasq_factoid", TINY + [
        f"exp_manager.exp_dir={tmp_path}", f"model.dataset.data_dir={tmp_path}", "model.dataset.train_file=train.json",
        "model.dataset.test_file=test.json", f"model.dataset.bioasq_golden={tmp_path / 'golden.json'}"], reveal)
    # the default restore path is where squad_v1 wrote its checkpoint
    assert Path(res["restore_from_path"]) == tmp_path / "squad_v1" / "seed42" / "checkpoints"
    assert res["revealed"] == [["iter_0000003", "latest"]]  # once, after the last step's checkpoint existed
    run = res["runs"][0]
    for split in ("dev", "test"):
        assert set(run[split]) >= {"strict_accuracy", "lenient_accuracy", "mrr"}
        s = run[split]
        assert 0.0 <= s["strict_accuracy"] <= s["mrr"] <= s["lenient_accuracy"] <= 1.0
    assert run["test"]["scored_questions"] == 6 and run["test"]["missing_questions"] == 0
    assert run["dev"]["scored_questions"] >= 1  # held-out training questions, scored on their own answers
    saved = (tmp_path / "bioasq_factoid" / "seed42" / "checkpoints" / "iter_0000003" / "config.yaml").read_text()
    assert "num_fc_layers: 1" in saved  # the SQuAD head's shape, not the recipe's 2


def test_dev_holdout_keeps_a_question_together_and_is_seed_free():
    from bio_megatron.tasks.qa_data import QAExample
    from bio_megatron.tasks.qa_holdout import golden_from_answers, held_out_ids

    ex = [QAExample(f"q{i}_{k:03d}", f"Question number {i}?", "ctx", [{"text": f"A{i}", "answer_start": 0}])
          for i in range(20) for k in (1, 2, 3)]
    ex.append(QAExample("copy_001", "question  NUMBER 3?", "ctx", [{"text": "a3", "answer_start": 0}]))
    dev = held_out_ids(ex, 0.2)
    groups = {e.qid.split("_")[0] if e.qid != "copy_001" else "q3" for e in ex if e.qid in dev}
    assert len(groups) == 4  # round(0.2 x 20 questions); the copy is q3's group, not a 21st question
    assert all({f"{g}_{k:03d}" for k in (1, 2, 3)} <= dev for g in groups)  # all snippets on one side
    assert ("copy_001" in dev) == ("q3_001" in dev)
    assert held_out_ids(list(reversed(ex)), 0.2) == dev  # file order (and seed) free
    gold = golden_from_answers([e for e in ex if e.qid.startswith("q3_") or e.qid == "copy_001"])
    assert gold == {"q3": [["A3"]], "copy": [["a3"]]}


@pytest.mark.parametrize("over, needle", [
    (["model.dataset.dev_file=dev.json"], "set model.dataset.dev_file=null (it is dev.json)"),
    (["model.dataset.dev_holdout_fraction=1.5"], "model.dataset.dev_holdout_fraction (1.5) must be in (0, 1)"),
])
def test_dev_holdout_config_errors(over, needle):
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_finetune_config("qa", QA / "bioasq_factoid.yaml", over)
