"""The encoder families, one module each, and the one place a model's family is decided.

``FAMILIES`` is the registry (one line per family). Everything that differs between families (HF model types and
classes, tokenizer kind, shape <-> HF config, tensor names, the models built) is asked of the family object
(:class:`~bio_megatron.families.base.Family`); nothing else branches on an objective, a tokenizer or a
``model_type`` string to find it. Checkpoints record ``model.family``; :func:`family_of_model` infers it for those
written before it was recorded (and for NeMo's configs, which do not carry it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bio_megatron.families.albert import ALBERT
from bio_megatron.families.base import Family, FamilyDefaults
from bio_megatron.families.bert import BERT
from bio_megatron.families.electra import ELECTRA
from bio_megatron.families.megatron_bert import MEGATRON_BERT
from bio_megatron.families.modernbert import MODERNBERT
from bio_megatron.families.roberta import ROBERTA
from bio_megatron.utils.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from bio_megatron.config.pretrain import ModelConfig

FAMILIES: dict[str, Family] = {
    MEGATRON_BERT.name: MEGATRON_BERT,
    BERT.name: BERT,
    ROBERTA.name: ROBERTA,
    ELECTRA.name: ELECTRA,
    ALBERT.name: ALBERT,
    MODERNBERT.name: MODERNBERT,
}


def _complete(family: object) -> None:
    """Give ``family`` the :class:`~bio_megatron.families.base.FamilyDefaults` of the members it does not define
    (members added to the protocol after the family was written), so every registered family implements it."""
    for member in ("shape_keys", "save_tokenizer", "parameter_count", "encoder_parameter_count",
                   "task_head_from_pretraining"):
        if not hasattr(family, member):
            default = getattr(FamilyDefaults, member)
            setattr(family, member, default.__get__(family) if callable(default) else default)


for _family in FAMILIES.values():
    _complete(_family)


def family_named(name: str, key: str = "model.family") -> Family:
    """The registered family ``name``; ConfigError naming ``key`` and the choices otherwise."""
    family = FAMILIES.get(name) if isinstance(name, str) else None
    if family is None:
        raise ConfigError(f"{key} ({name!r}) must be one of {', '.join(FAMILIES)}")
    return family


def hf_model_types() -> dict[str, Family]:
    """Every ``config.json`` ``model_type`` the registry reads, to its family."""
    return {t: f for f in FAMILIES.values() for t in f.hf_model_types}


def family_of_hf(config_json: dict, where: str) -> Family:
    """The family of an HF ``config.json`` (its ``model_type``); CheckpointError naming ``where`` and the
    supported model types otherwise."""
    types = hf_model_types()
    model_type = config_json.get("model_type") if isinstance(config_json, dict) else None
    if model_type not in types:
        raise CheckpointError(f"{where}: model_type {model_type!r}, expected one of {sorted(types)}")
    return types[model_type]


def _get(model: dict | ModelConfig, key: str, default=None):
    return model.get(key, default) if isinstance(model, dict) else getattr(model, key, default)


def family_of_model(model: dict | ModelConfig, vocab_file=None) -> Family:
    """The family of a model config (``ModelConfig``, or a checkpoint's ``config.yaml`` ``model`` section):
    ``model.family`` where recorded (checked against the registry). Older checkpoints and NeMo configs do not
    record it; for them, and only here, it is inferred: objective electra -> electra; objective mlm or a
    byte-level BPE tokenizer -> roberta; post-LN layers -> bert; otherwise megatron_bert. ``vocab_file``: the
    vocabulary actually used, where at hand (a checkpoint's ``vocab.json``), else the config's is read."""
    name = _get(model, "family")
    if name is not None:
        family = family_named(name)
        block = _get(model, "transformer_block_type")
        if block is not None and block != family.block_type:  # the layers built follow the block type
            raise ConfigError(f"model.family ({name}) has {family.block_type} layers but model.transformer_block_type "
                              f"is {block}: set model.transformer_block_type={family.block_type}")
        return family
    if _get(model, "objective") == "electra":
        return ELECTRA
    if vocab_file is None:
        tokenizer = _get(model, "tokenizer") or {}
        vocab_file = _get(tokenizer, "vocab_file")
    if _get(model, "objective") == "mlm" or _is_bpe_name(vocab_file):
        return ROBERTA
    if _get(model, "transformer_block_type") == "post_ln":
        return BERT
    return MEGATRON_BERT


def _is_bpe_name(vocab_file) -> bool:
    """A byte-level BPE vocabulary as configs name it (``vocab.json``, or a folder holding it): read from the
    name alone, so a config is classified without the files at hand."""
    from pathlib import Path

    if not vocab_file:
        return False
    path = Path(vocab_file)
    return path.name == "vocab.json" or (path.is_dir() and (path / "vocab.json").is_file())


__all__ = ["FAMILIES", "Family", "family_named", "family_of_hf", "family_of_model", "hf_model_types"]
