"""The ``classify`` dataset options, on tiny synthetic files (fast): HoC's ``class_balancing: weighted_loss`` is
torch's BCE ``pos_weight`` = negatives / positives per label of the training split, and PubMedQA's
``pubmedqa_long_answer`` pairs the question with the conclusion (reasoning-free) instead of the contexts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bio_megatron.config.finetune import load_finetune_config
from bio_megatron.tasks.blurb_data import read_pubmedqa
from bio_megatron.tasks.classify import ClassifyTask
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.builtin import resolve_vocab

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"
# sentence labels (hallmark indices) of a tiny HoC split: hallmark 0 in 2 of 6, 3 in 1, 7 in 3, the rest never
HOC_LABELS = [{0}, {0, 7}, set(), {3, 7}, {7}, set()]


def _task(tmp_path: Path, over: list[str]) -> ClassifyTask:
    cfg = load_finetune_config("classify", RECIPE, [f"model.dataset.data_dir={tmp_path}"] + over, 1)
    tok = cfg.model.tokenizer
    return ClassifyTask(cfg, load_tokenizer(resolve_vocab(tok.vocab_file), tok.do_lower_case))


def _write_hoc(path: Path) -> None:
    rows = ["labels\tsentence\tindex"]
    for i, on in enumerate(HOC_LABELS):
        rows.append(",".join(f"{j}_{int(j in on)}" for j in range(10)) + f"\tSentence number {i} about cells .\t"
                    f"{1000 + i // 3}_s{i % 3}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_hoc_weighted_loss_is_bce_with_negatives_over_positives_as_pos_weight(tmp_path, caplog):
    _write_hoc(tmp_path / "test.tsv")  # the tiny recipe trains, validates and tests on test.tsv
    over = ["model.dataset.task_name=hoc", "model.dataset.class_balancing=weighted_loss"]
    with caplog.at_level(logging.INFO):
        task = _task(tmp_path, over)
    positives = torch.tensor([sum(j in on for on in HOC_LABELS) for j in range(10)], dtype=torch.float32)
    expected = torch.where(positives > 0, (len(HOC_LABELS) - positives) / positives.clamp(min=1), 1.0)
    assert torch.equal(task.weights, expected) and task.weights[[0, 3, 7]].tolist() == [2.0, 5.0, 1.0]
    assert "pos_weight" in caplog.text

    batch = task.collate(task.train, list(range(len(HOC_LABELS))), 16)
    logits = torch.randn(len(HOC_LABELS), 10, generator=torch.Generator().manual_seed(0))
    want = torch.nn.BCEWithLogitsLoss(pos_weight=expected)(logits, batch["label"])
    assert torch.allclose(task.loss(logits, batch), want, rtol=0, atol=1e-7)
    # the weighting changes the loss: it is not the plain mean BCE
    plain = _task(tmp_path, ["model.dataset.task_name=hoc"])
    assert plain.weights is None
    assert not torch.allclose(plain.loss(logits, batch), want)
    assert torch.allclose(plain.loss(logits, batch), F.binary_cross_entropy_with_logits(logits, batch["label"]))


def _write_pubmedqa(path: Path, long_answer: bool = True) -> None:
    data = {"101": {"QUESTION": "Does A cause B?", "CONTEXTS": ["A was given.", "B rose."], "final_decision": "yes"},
            "102": {"QUESTION": "Is C safe?", "CONTEXTS": ["C was tried."], "final_decision": "maybe"}}
    if long_answer:
        data["101"]["LONG_ANSWER"] = "A causes B."
        data["102"]["LONG_ANSWER"] = "C may be safe."
    path.write_text(json.dumps(data), encoding="utf-8")


def test_pubmedqa_long_answer_pairs_the_question_with_the_conclusion(tmp_path):
    _write_pubmedqa(tmp_path / "train.json")
    required = read_pubmedqa(tmp_path / "train.json")
    free = read_pubmedqa(tmp_path / "train.json", long_answer=True)
    assert [(e.text, e.text_b, e.label) for e in required] == [("Does A cause B?", "A was given. B rose.", "yes"),
                                                               ("Is C safe?", "C was tried.", "maybe")]
    assert [(e.text, e.text_b, e.label) for e in free] == [("Does A cause B?", "A causes B.", "yes"),
                                                           ("Is C safe?", "C may be safe.", "maybe")]

    files = ["model.dataset.task_name=pubmedqa", "model.dataset.train_file=train.json",
             "model.dataset.dev_file=train.json", "model.dataset.test_file=train.json"]
    assert [e.text_b for e in _task(tmp_path, files).train.examples] == ["A was given. B rose.", "C was tried."]
    task = _task(tmp_path, files + ["model.dataset.pubmedqa_long_answer=true"])
    assert [e.text_b for e in task.train.examples] == ["A causes B.", "C may be safe."]
    assert [e.text_b for e in task.split("dev").examples] == ["A causes B.", "C may be safe."]
    # predict classify reads the dataset's own file as the checkpoint's model.dataset says (its saved config)
    from bio_megatron.predict.classify import read_examples
    assert [e.text_b for e in read_examples(tmp_path / "train.json", task.d)] == ["A causes B.", "C may be safe."]


def test_pubmedqa_long_answer_needs_the_field(tmp_path):
    _write_pubmedqa(tmp_path / "train.json", long_answer=False)
    read_pubmedqa(tmp_path / "train.json")  # reasoning-required does not need it
    with pytest.raises(DataError, match="PMID 101: no string LONG_ANSWER"):
        read_pubmedqa(tmp_path / "train.json", long_answer=True)
