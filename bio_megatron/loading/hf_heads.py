"""Hugging Face task classes -> our heads: which class holds which task's head, and reading its settings and
weights back (the writing half, class choice and remote code, is :mod:`bio_megatron.export.hf_heads`).

A head that equals one of transformers' fixed heads is the family's plain class (``MegatronBertFor*``, ``BertFor*``,
..., :mod:`bio_megatron.families`);
every other NeMo MLP head is the remote-code ``BioMegatronFor*`` class, whose settings travel in ``config.json``
as ``bio_megatron_head`` and whose weights keep our own names (``head.mlp.layer0.*``, ...).

This module imports neither transformers nor megatron: :func:`bio_megatron.loading.source.resolve_source` reads
HF folders with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bio_megatron.families import FAMILIES, Family
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    from bio_megatron.config.finetune import FinetuneModelConfig

REMOTE_CLASS = {"ner": "BioMegatronForTokenClassification", "qa": "BioMegatronForQuestionAnswering",
                "re": "BioMegatronForSequenceClassification"}
# Every family's plain task classes (its own head names: ``Family.head_from_hf``) and the remote-code ones. RE and
# BLURB classification share the sequence classifier, which reads back as RE's head.
CLASS_TASK = {**{f.hf_class(t): t for f in FAMILIES.values() for t in ("ner", "qa", "re")},
              **{c: t for t, c in REMOTE_CLASS.items()}}
HEAD_KEYS = ("num_fc_layers", "fc_hidden_size", "activation", "fc_dropout")
_ACTIVATIONS = ("relu", "gelu", "tanh")


def head_block(task: str) -> tuple[str, str]:
    """The config block holding the head and its layer-count key (RE and classify keep NeMo's SequenceClassifier
    names)."""
    return ("classifier_head", "num_output_layers") if task in ("re", "classify") else ("head", "num_fc_layers")


def hf_to_head(task: str, hsd: dict, family: Family) -> dict:
    """The ``head.*`` weights of an HF state dict, from either kind of class (KeyError names a missing weight)."""
    # the remote-code classes keep NeMo's MLP (``head.mlp.*``); a plain class's own ``head.*`` (ModernBERT's
    # prediction head) is the family's to map
    ours = {k: v for k, v in hsd.items() if k.startswith("head.mlp.")}
    return ours or family.head_from_hf(task, hsd)


def validate_head(settings: object, where: str) -> dict:
    """``bio_megatron_head`` from a config.json, checked (CheckpointError quoting the bad values)."""
    if not isinstance(settings, dict):
        raise CheckpointError(f"{where}: bio_megatron_head must be an object with {list(HEAD_KEYS)}, got {settings!r}")
    problems = [f"missing {k}" for k in HEAD_KEYS if k not in settings]
    problems += [f"unknown key {k}" for k in settings if k not in HEAD_KEYS]
    n, width, act = settings.get("num_fc_layers"), settings.get("fc_hidden_size"), settings.get("activation")
    if "num_fc_layers" in settings and not (isinstance(n, int) and n >= 1):
        problems.append(f"num_fc_layers ({n!r}) must be an integer >= 1")
    if "fc_hidden_size" in settings and not (width is None or (isinstance(width, int) and width >= 1)):
        problems.append(f"fc_hidden_size ({width!r}) must be null or an integer >= 1")
    drop = settings.get("fc_dropout")
    if "fc_dropout" in settings and not (isinstance(drop, (int, float)) and 0 <= drop < 1):
        problems.append(f"fc_dropout ({drop!r}) must be a number in [0, 1)")
    if "activation" in settings and act not in _ACTIVATIONS:
        problems.append(f"activation ({act!r}) must be one of {list(_ACTIVATIONS)}")
    if problems:
        raise CheckpointError(f"{where}: bio_megatron_head {settings}: " + "; ".join(problems))
    return dict(settings)


def plain_head(task: str) -> dict:
    """The head every family's plain ``*For{TokenClassification,QuestionAnswering}`` (one Linear) and
    ``*ForSequenceClassification`` (tanh pooler as wide as the encoder + Linear) computes, as ``Source.head``."""
    block, count = head_block(task)
    plain = {count: 2, "activation": "tanh"} if task in ("re", "classify") else {count: 1}
    return {block: plain, "fc_hidden_size": None}


def source_head(arch: str, hf_cfg: dict, where: str) -> dict:
    """The head of an HF task folder (class ``arch``) in a checkpoint's ``config.yaml`` terms (``Source.head``)."""
    task = CLASS_TASK[arch]
    if arch not in REMOTE_CLASS.values():  # a family's plain class: exactly the head it computes
        return plain_head(task)
    block, count = head_block(task)
    if "bio_megatron_head" not in hf_cfg:
        raise CheckpointError(f"{where}: {arch} needs bio_megatron_head ({list(HEAD_KEYS)}) in config.json")
    s = validate_head(hf_cfg["bio_megatron_head"], where)
    return {block: {count: s["num_fc_layers"], "activation": s["activation"], "fc_dropout": s["fc_dropout"]},
            "fc_hidden_size": s["fc_hidden_size"]}


def apply_head(model_cfg: FinetuneModelConfig, saved: dict) -> None:
    """Set a task model config's head from ``Source.head`` (``fc_hidden_size`` and the head block's keys)."""
    for block in ("head", "classifier_head"):
        for k, v in (saved.get(block) or {}).items():
            setattr(getattr(model_cfg, block), k, v)
    if "fc_hidden_size" in saved:
        model_cfg.fc_hidden_size = saved["fc_hidden_size"]
