"""Every registered fine-tuning task implements :class:`bio_megatron.tasks.protocol.Task`: built from its tiny
recipe on the fixture data (no model, no training), it passes ``isinstance`` against the runtime-checkable
protocol, each method has the protocol's parameters, and what the protocol promises about the values holds on
real data (splits have features, ``collate`` gives the model's inputs, ``decode`` is what ``outputs`` returns).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from bio_megatron.tasks.protocol import TASKS, Split, Task

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"ner": "ner/tiny_ner.yaml", "re": "re/tiny_re.yaml", "qa": "qa/tiny_qa.yaml",
           "classify": "classify/tiny_classify.yaml"}
LIMIT = ["model.dataset.max_train_examples=8", "model.dataset.max_eval_examples=8"]


def _members(proto: type) -> dict[str, object]:
    """The protocol's methods (and the ``num_classes`` property) as declared on the class."""
    return {k: v for k, v in vars(proto).items()
            if not k.startswith("_") and (callable(v) or isinstance(v, (staticmethod, property)))}


@pytest.fixture(scope="module")
def tokenizer():
    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.builtin import resolve_vocab

    return load_tokenizer(resolve_vocab("bert_base_cased"), None)


def _build(name: str, tokenizer, monkeypatch) -> tuple[Task, object]:
    from bio_megatron.config.finetune import load_finetune_config

    monkeypatch.chdir(ROOT)  # the recipes name their fixture data relative to the checkout
    cfg = load_finetune_config(name, ROOT / "nemo_configs" / RECIPES[name], LIMIT, 1)
    return TASKS[name](cfg, tokenizer, None), cfg


def test_the_registry_names_every_task_config():
    from bio_megatron.config.finetune import CONFIG_CLASSES

    assert set(TASKS) == set(CONFIG_CLASSES) == set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_task_class_has_the_protocol_signatures(name):
    cls = TASKS[name]
    assert cls.name == name
    for member, declared in _members(Task).items():
        have = inspect.getattr_static(cls, member, None)
        assert have is not None, f"{cls.__name__} lacks {member}"
        if isinstance(declared, property):
            continue  # a property or a plain class attribute (QA's fixed 2) both read as an int
        assert isinstance(have, staticmethod) == isinstance(declared, staticmethod), \
            f"{cls.__name__}.{member}: static in one, not the other"
        want = [(p.name, p.kind) for p in inspect.signature(getattr(Task, member)).parameters.values()]
        got = [(p.name, p.kind) for p in inspect.signature(getattr(cls, member)).parameters.values()]
        assert got == want, f"{cls.__name__}.{member}{got} differs from Task.{member}{want}"


def _logits(task: Task, name: str, batch: dict) -> torch.Tensor:
    """Random logits of the head's shape: per token (NER, QA start/end) or per sequence (RE, classify)."""
    b, s = batch["input_ids"].shape
    shape = (b, s, task.num_classes) if name in ("ner", "qa") else (b, task.num_classes)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_registered_task_satisfies_the_protocol(name, tokenizer, monkeypatch):
    task, cfg = _build(name, tokenizer, monkeypatch)
    assert isinstance(task, Task)
    assert isinstance(task.train, Split) and len(task.train.features) > 0
    dev = task.split("dev")
    assert isinstance(dev, Split) and task.split("dev") is dev  # read once, cached
    n = min(3, len(dev.features))
    lengths = [task.length(dev, i) for i in range(n)]
    seq = max(lengths) + 3
    batch = task.collate(dev, [*range(n), -1], seq)  # -1: a padding row of the last evaluation group
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["tokentype_ids"].shape == (n + 1, seq)
    assert batch["attention_mask"].sum(-1).tolist() == [*lengths, lengths[0]]
    assert batch["index"].tolist() == [*range(n), -1]
    logits = _logits(task, name, batch)
    assert torch.isfinite(task.loss(logits, batch))
    outputs = task.outputs(logits, batch)
    # decode, what predict runs on new input, needs only the dataset config and gives the same predictions
    assert outputs == type(task).decode(cfg.model.dataset, logits, batch["attention_mask"])
    assert len(outputs) == n + 1
    # the whole split through collate -> outputs -> score, as the fine-tuning loop's evaluation
    every = list(range(len(dev.features)))
    full = task.collate(dev, every, max(task.length(dev, i) for i in every))
    scores = task.score(dev, task.outputs(_logits(task, name, full), full))
    assert task.metric in scores
