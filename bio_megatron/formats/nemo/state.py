"""NeMo ``MegatronBertModel`` (and task-model) state dicts <-> our full (TP1) megatron-core state.

A ``.nemo`` holds ``LightningModule.state_dict()``: flat names, one file per (TP, PP) rank. NeMo's legacy
(non-mcore) BERT, ``NeMoBertModel`` in ``nemo/collections/nlp/models/language_modeling/megatron/bert/
bert_model.py`` (NeMo 2.4), is Megatron-LM's legacy module tree under the attribute ``model``::

    model.language_model.embedding.{word,position,tokentype}_embeddings.weight   (tokentype: binary head only)
    model.language_model.encoder.layers.N.{input_layernorm, self_attention.query_key_value,
        self_attention.dense, post_attention_layernorm, mlp.dense_h_to_4h, mlp.dense_4h_to_h}.{weight,bias}
    model.language_model.encoder.final_layernorm.*   model.language_model.pooler.dense.*  (add_pooler)
    model.lm_head.{bias, dense.*, layernorm.*}        model.binary_head.*
    model.word_embeddings.weight                      (last pipeline stage, PP > 1: the tied copy)

so the Megatron-LM mapping of :mod:`~bio_megatron.formats.megatron_lm.state` is reused, not restated.
megatron-core's parallel linears add ``<module>._extra_state`` (None) entries, which NeMo writes and
tolerates when absent. Task models nest the encoder under ``bert_model.`` (NeMo 1.x: ``bert_model.
language_model``, 2.x: ``bert_model.model.language_model``) and name the head ``classifier.mlp.layerK``,
which are our ``head.mlp.layerK``. ``megatron_amp_O2`` adds ``module.`` after ``model.``. With
``megatron_legacy: true`` (checkpoints converted from 2020 Megatron-LM) the QKV rows are stored
``[3, np, hn]`` (NeMo's ``ParallelAttention._transpose_last_dim``), i.e. Megatron-LM's checkpoint_version 0.

``mcore_bert: true`` models are saved with dist-checkpointing (a ``model_weights/`` folder) under
megatron-core's names, which are ours with a ``model.`` prefix and the layers stacked on a leading axis.
"""

from __future__ import annotations

import re

import torch

from bio_megatron.formats.megatron_lm.state import (flatten, legacy_to_mcore, mcore_to_legacy_shards, merge_pp,
                                                       merge_tp, split_dim)
from bio_megatron.models.hf_convert import TE_ALIASES
from bio_megatron.utils.errors import CheckpointError

PRETRAIN_PREFIX, TASK_PREFIX = "model.", "bert_model.model."
_WRAPPERS = ("bert_model.", "model.", "module.")  # attribute names NeMo puts in front of the BERT module
_EXTRA_STATE = ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")


def _strip(key: str) -> str:
    while key.startswith(_WRAPPERS):
        key = key.split(".", 1)[1]
    return key


def shard_to_ours(sd: dict, qkv_version: float, heads_per_shard: int,
                  where: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One NeMo shard -> (our encoder/LM names with local layer indices, our ``head.*`` names)."""
    legacy, head = {}, {}
    for key, value in sd.items():
        if key.endswith("_extra_state") or not torch.is_tensor(value):
            continue  # megatron-core/Transformer Engine bookkeeping: no weights
        value = value.float() if value.is_floating_point() else value  # O2 / bf16 archives
        if key.startswith("classifier."):
            head["head." + key[len("classifier."):]] = value
            continue
        name = _strip(key)
        if name == "word_embeddings.weight":
            continue  # the last stage's copy of the tied word embeddings
        if not name.startswith(("language_model.", "lm_head.", "binary_head.")):
            raise CheckpointError(f"{where}: unexpected weight {key} (not part of NeMo's Megatron BERT)")
        legacy[name] = value
    return legacy_to_mcore(legacy, qkv_version, heads_per_shard, where), head


def shards_to_ours(shards: dict[tuple[int, int], dict], qkv_version: float, heads: int,
                   where: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every (tp, pp) shard -> our full TP1 state (global layer indices) and the task head (if any)."""
    tp, pp = max(k[0] for k in shards) + 1, max(k[1] for k in shards) + 1
    missing = [k for k in ((t, p) for t in range(tp) for p in range(pp)) if k not in shards]
    if missing:
        raise CheckpointError(f"{where}: shards (tp, pp) {missing} are missing (found {tp} TP x {pp} PP ranks)")
    if heads % tp:
        raise CheckpointError(f"{where}: num_attention_heads ({heads}) not divisible by its TP size ({tp})")
    stages, head = [], {}
    for p in range(pp):
        parts = []
        for t in range(tp):
            ours, h = shard_to_ours(shards[(t, p)], qkv_version, heads // tp, where)
            parts.append(ours)
            if p == pp - 1 and t == 0:
                head = h  # replicated on every tensor-parallel rank
        stages.append(merge_tp(parts, where))
    return merge_pp(stages), head


def ours_to_shards(full: dict[str, torch.Tensor], head: dict[str, torch.Tensor], tp: int, pp: int,
                   prefix: str) -> dict[tuple[int, int], dict]:
    """Our full state (+ ``head.*``) -> NeMo's flat state dict of every (tp, pp) rank, as NeMo 2.4 saves it."""
    layers = 1 + max(int(m.group(1)) for m in map(_LAYER.match, full) if m)
    if layers % pp:
        raise CheckpointError(f"--pp {pp}: must divide num_layers ({layers})")
    per, out = layers // pp, {}
    for p in range(pp):
        stage = {}
        for key, value in full.items():
            m = _LAYER.match(key)
            if m:
                if p * per <= int(m.group(1)) < (p + 1) * per:
                    stage[f"encoder.layers.{int(m.group(1)) - p * per}.{m.group(2)}"] = value
            elif (p == 0) if key.startswith("embedding.") else (p == pp - 1):
                stage[key] = value  # embeddings on the first stage; final LN, pooler and heads on the last
        for t, nested in enumerate(mcore_to_legacy_shards(stage, tp)):
            flat = flatten(nested)
            if pp > 1 and p == pp - 1 and "lm_head.bias" in flat:  # NeMo's tied copy on the last stage
                flat["word_embeddings.weight"] = full["embedding.word_embeddings.weight"].chunk(tp)[t].clone()
            shard: dict = {}
            for k, v in flat.items():
                shard[prefix + k] = v
                if k.endswith(".weight") and any(f"{op}.weight" in k for op in _EXTRA_STATE):
                    shard[prefix + k[: -len("weight")] + "_extra_state"] = None
            if p == pp - 1:
                shard.update({"classifier." + k[len("head."):]: v.detach().clone() for k, v in head.items()})
            out[(t, p)] = shard
    return out


def dist_to_ours(plain: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Tensors of a NeMo ``mcore_bert`` dist checkpoint (megatron-core names, stacked layers) -> ours."""
    te_to_local = {te: local for te, local in TE_ALIASES.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in plain.items():
        if not torch.is_tensor(value) or key.endswith("_extra_state"):
            continue
        name = _strip(key)
        if name.startswith("encoder.layers.") and not _LAYER.match(name):
            rest = name[len("encoder.layers."):]
            rest = te_to_local.get(rest, rest)
            for i, t in enumerate(value.float().unbind(0)):
                out[f"encoder.layers.{i}.{rest}"] = t.clone()
        elif name == "output_layer.weight":
            continue  # tied to the word embeddings
        elif name.startswith(("embedding.", "encoder.", "pooler.", "lm_head.", "output_layer.", "binary_head.")):
            out[name] = value.float()
        else:
            raise CheckpointError(f"{where}: unexpected tensor {key} (not part of megatron-core's BertModel)")
    return out


def ours_to_dist(full: dict[str, torch.Tensor], prefix: str = PRETRAIN_PREFIX) -> dict[str, torch.Tensor]:
    """Our full state -> megatron-core's dist-checkpoint tensors (TE LayerNorm names, layers stacked)."""
    local_to_te = {local: te for te, local in TE_ALIASES.items()}
    out, stacks = {}, {}
    for key, value in full.items():
        m = _LAYER.match(key)
        if m:
            stacks.setdefault(local_to_te.get(m.group(2), m.group(2)), {})[int(m.group(1))] = value
        else:
            out[prefix + key] = value.detach().clone().contiguous()
    for rest, per in stacks.items():
        out[f"{prefix}encoder.layers.{rest}"] = torch.stack([per[i] for i in sorted(per)]).contiguous()
    return out


__all__ = ["PRETRAIN_PREFIX", "TASK_PREFIX", "dist_to_ours", "ours_to_dist", "ours_to_shards", "shards_to_ours",
           "split_dim"]
