"""NER fine-tuning on real BC5CDR-chem slices: layout invariance (TP2, TP2xPP2 vs TP1; IOB vs NeMo format)
and a learning check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ft_runs import ROOT, finetune_rank
from harness import cli_forked, run_world

QUICK = ["trainer.max_steps=3", "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.head.fc_dropout=0.0",
         "model.head.num_fc_layers=2", "model.fc_hidden_size=48", "model.dataset.max_eval_examples=16",
         "model.dataset.test_file=null", "trainer.val_check_interval=3", "model.micro_batch_size=4"]


def test_tp2_and_tp2pp2_equal_tp1(tmp_path):
    ref = run_world(1, finetune_rank, "ner", QUICK + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=tp1"])[0]
    # TP2 reads the same sentences in NeMo's text_*/labels_* format (converted from the IOB files)
    from bio_megatron.tasks.ner_data import iob_to_nemo

    fixtures = ROOT / "tests" / "fixtures" / "finetune"
    iob_to_nemo(fixtures / "bc5cdr_chem_train_head.tsv", tmp_path / "nemo", "train")
    iob_to_nemo(fixtures / "bc5cdr_chem_devel_head.tsv", tmp_path / "nemo", "dev")
    tp2 = run_world(2, finetune_rank, "ner", QUICK + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=tp2",
                                                      "model.tensor_model_parallel_size=2", "model.dataset.format=nemo",
                                                      f"model.dataset.data_dir={tmp_path / 'nemo'}",
                                                      "model.dataset.train_file=text_train.txt",
                                                      "model.dataset.dev_file=text_dev.txt"])
    tp2pp2 = run_world(4, finetune_rank, "ner", QUICK + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=tp2pp2",
                                                         "model.tensor_model_parallel_size=2",
                                                         "model.pipeline_model_parallel_size=2"])
    assert len(ref["losses"]) == 3 and ref["losses"][0] > 0.1
    for res in (tp2[0], tp2[1], tp2pp2[0], tp2pp2[3]):
        assert max(abs(a - b) for a, b in zip(res["losses"], ref["losses"])) < 1e-5, (res["losses"], ref["losses"])
        assert abs(res["dev"]["f1"] - ref["dev"]["f1"]) < 1e-9
    # the checkpoint kept is self-describing: label map beside the shards
    labels = (tmp_path / "tp2" / "checkpoints" / "iter_0000003" / "label_ids.csv").read_text().split()
    assert labels == ["O", "B-Chemical", "I-Chemical"]


def _learn_and_predict(over: list[str]) -> dict:
    """Fine-tune, then run ``predict ner`` on dev sentences written as plain text (reloading the best checkpoint)."""
    from ft_runs import ROOT

    from bio_megatron.formats.finetuned import load_finetuned

    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict.ner import predict_entities
    from bio_megatron.tasks.ner_data import read_iob

    res = finetune_rank("ner", over)
    single_process()
    loaded = load_finetuned(res["checkpoint"])
    sents = read_iob(ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv")[:40]
    docs = [" ".join(s.words) for s in sents]
    res["predicted"] = [(d, predict_entities(loaded, d)) for d in docs]
    return res


@pytest.mark.extended  # a real-data learning run (~17 s on two cores): the brief puts those in the extended suite
def test_learning_check_bc5cdr_chem(tmp_path):
    """A tiny model fine-tuned from scratch on 600 real BC5CDR-chem sentences must find chemicals on 200
    held-out dev sentences (an all-O tagger scores F1 = 0)."""
    over = [f"exp_manager.exp_dir={tmp_path}", "trainer.max_epochs=8", "trainer.val_check_interval=100",
            "model.hidden_dropout=0.0", "model.attention_dropout=0.0"]
    (res,) = run_world(1, _learn_and_predict, over)
    print("learning check:", json.dumps({"dev_f1": res["dev"]["f1"], "test_f1": res["test"]["f1"],
                                         "seconds": res["train_seconds"]}))
    assert res["dev"]["f1"] > 20.0, res["dev"]
    assert res["test"]["f1"] == res["dev"]["f1"]  # test file = dev slice here: the best checkpoint was reloaded
    assert res["losses"][-1] < 0.5 * res["losses"][0]
    # the test predictions, as conlleval columns, score the same with `bio-megatron evaluate ner`
    conll = Path(res["test_predictions"])
    assert conll.suffix == ".conll"
    done = cli_forked(["evaluate", "ner", "--input", str(conll)])
    assert done.returncode == 0, done.stderr[-2000:]
    assert abs(json.loads(done.stdout)["f1"] - res["test"]["f1"]) < 1e-9
    found = [(doc, e) for doc, ents in res["predicted"] for e in ents]
    assert len(found) >= 5  # the trained tagger finds chemicals in raw text ...
    for doc, e in found:  # ... with exact character offsets
        assert doc[e["start"]:e["end"]] == e["text"] and e["type"] == "Chemical"
