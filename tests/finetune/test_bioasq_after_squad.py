"""BioASQ factoid continues from a SQuAD-fine-tuned checkpoint: the SQuAD head (and its shape) is kept even
if the recipe asks for another, and dev is scored with the BioASQ factoid measures over pooled snippets."""

from __future__ import annotations

import json
from pathlib import Path

from ft_runs import ROOT, finetune_rank
from harness import run_world

SLICE = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"


def _bioasq_files(tmp: Path) -> tuple[Path, Path]:
    """The real SQuAD slice as BioASQ snippets: answerable questions only, ids ``<qid>_<NNN>``; golden JSON."""
    data = json.loads(SLICE.read_text())
    golden = []
    for art in data["data"]:
        for para in art["paragraphs"]:
            para["qas"] = [q for q in para["qas"] if q.get("answers")]
            for q in para["qas"]:
                golden.append({"id": q["id"], "type": "factoid", "exact_answer": [[a["text"]] for a in q["answers"]]})
                q["id"] = f"{q['id']}_001"
                q.pop("is_impossible", None)
    data["version"] = "BioASQ6b"
    (tmp / "bioasq.json").write_text(json.dumps(data))
    (tmp / "golden.json").write_text(json.dumps({"questions": golden}))
    return tmp / "bioasq.json", tmp / "golden.json"


def test_bioasq_continues_from_squad_checkpoint(tmp_path):
    quick = ["trainer.max_steps=3", "trainer.val_check_interval=3", f"exp_manager.exp_dir={tmp_path}",
             "model.dataset.max_eval_examples=12"]
    run_world(1, finetune_rank, "qa", quick + ["exp_manager.name=squad", "model.dataset.version_2_with_negative=false"])
    data, golden = _bioasq_files(tmp_path)
    (res,) = run_world(1, finetune_rank, "qa", quick + [
        "exp_manager.name=bioasq", f"model.restore_from_path={tmp_path / 'squad' / 'checkpoints'}",
        f"model.dataset.data_dir={tmp_path}", "model.dataset.train_file=bioasq.json",
        "model.dataset.dev_file=bioasq.json", "model.dataset.test_file=null", f"model.dataset.bioasq_golden={golden}",
        "model.dataset.version_2_with_negative=false", "model.head.num_fc_layers=2"])
    assert set(res["dev"]) >= {"strict_accuracy", "lenient_accuracy", "mrr"}
    assert 0.0 <= res["dev"]["strict_accuracy"] <= res["dev"]["lenient_accuracy"] <= 1.0
    assert res["dev"]["strict_accuracy"] <= res["dev"]["mrr"] <= res["dev"]["lenient_accuracy"]
    saved = (tmp_path / "bioasq" / "checkpoints" / "iter_0000003" / "config.yaml").read_text()
    assert "num_fc_layers: 1" in saved  # the SQuAD head's shape, not the recipe's 2
