"""Filling a model's shards: from full TP1 tensors (:func:`load_full_state`, at any TP/PP layout, with the same
global key/slice bookkeeping as the layout-invariant init) and a task model (:class:`~bio_megatron.families.task.
TaskModel`) from a :class:`~bio_megatron.formats.source.Source` (:func:`load_into`): our checkpoints through
dist-checkpointing (any saved layout), Hugging Face folders through :func:`load_full_state`.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.formats.hf.read import read_hf_state
from bio_megatron.formats.source import Source
from bio_megatron.models.hf_convert import TE_ALIASES
from bio_megatron.models.init import fill_by_global_key, sharded_parts
from bio_megatron.training import integrity
from bio_megatron.training.checkpoint import from_main_params, load_sharded
from bio_megatron.training.checkpoint_dir import verify
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def task_padded_vocab(m: ModelConfig, vocab_size: int, src: Source | None) -> int:
    """Keep the checkpoint's padded vocabulary when this TP size divides it (dist-checkpointing then loads
    the embedding shards unchanged); otherwise Megatron's rule (multiple of 128 x TP)."""
    tp = m.tensor_model_parallel_size
    if src is not None and src.padded_vocab and src.padded_vocab % tp == 0 and src.padded_vocab >= vocab_size:
        return int(src.padded_vocab)
    return padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp)


def load_into(model: nn.Module, src: Source, encoder_only: bool) -> set[str]:
    """Fill ``model`` from ``src``; returns the global keys filled (the rest keep, or get from ``init_task_model``,
    their initial values). ``encoder_only`` (a pretraining model, or another task's checkpoint): the head
    keeps its initialisation, except the tensors its family takes from a pretraining head that ``src`` holds
    (``Family.task_head_from_pretraining``: ModernBERT's dense and norm, as transformers' ``from_pretrained``)."""
    inherit = dict(model.family.task_head_from_pretraining) if encoder_only else {}
    if src.kind == "hf":
        full = read_hf_state(src.path, model.shape, model.padded_vocab)
        filled = load_full_state(model, full, skip_prefix="head." if encoder_only else None)
        # the last stage's head, at any TP layout (only a family that inherits head tensors walks the model again)
        heads = fill_by_global_key(model, lambda key, _: full[inherit[key]],
                                   lambda _, sh: inherit.get(sh.key) in full) if inherit else []
        _log_taken(src, [inherit[key] for key in heads])
        return filled | set(heads)
    sharded = model.sharded_state_dict()
    wanted = {k: v for k, v in sharded.items() if not (encoder_only and k.startswith("head."))}
    heads = {k: v for k, v in sharded.items() if isinstance(v, ShardedTensor) and v.key in inherit}
    if heads:  # this stage holds the head: its inherited tensors are read under the pretraining head's keys
        saved = _saved_keys(src.path)
        wanted.update({k: dataclasses.replace(v, key=inherit[v.key]) for k, v in heads.items()
                       if inherit[v.key] in saved})
        _log_taken(src, [inherit[v.key] for v in heads.values() if inherit[v.key] in saved])
    # the global keys filled, taken before from_main_params renames the entries it redirects
    filled = {sh.key for k, sh in sharded_parts(sharded) if isinstance(sh, ShardedTensor) and k in wanted}
    from_main_params(wanted, src.path)  # an fp32 model from a bf16/fp16 run takes its fp32 main parameters
    state = load_sharded(src.path, {"model": wanted})["model"]  # verified, pickle allow-lists, one-line errors
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (encoder_only and k.startswith("head.")) and not k.endswith("_extra_state")]
    if missing or unexpected:
        raise CheckpointError(f"{src.path}: weights do not match the model (missing {missing[:5]}, "
                              f"unexpected {list(unexpected)[:5]})")
    return filled


def _saved_keys(path) -> set[str]:
    """The tensor keys a dist-checkpointing checkpoint holds (its verified, allow-listed ``.metadata``): a
    pretraining checkpoint has its MLM head, a bare encoder's or another task's has not."""
    from torch.distributed.checkpoint import FileSystemReader

    verify(path)
    with integrity.restricted_loading():
        return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def _log_taken(src: Source, names: list[str]) -> None:
    if names:
        log.info("task head: %s from the pretraining head of %s, the rest fresh", ", ".join(names), src.path)


# dist-checkpointing's key of a layer stack: ``encoder.layers.<name>``, or nested (ELECTRA's ``generator.encoder...``)
_LAYER_STACK = re.compile(r"^((?:.+\.)?encoder\.layers\.)(.+)$")


@torch.no_grad()
def load_full_state(model: nn.Module, full: dict[str, torch.Tensor], skip_prefix: str | None = None) -> set[str]:
    """Copy an unsharded (TP1, per-layer) state dict into this rank's shards, using the same global
    key/slice bookkeeping as the layout-invariant init: works at any TP/PP layout. A layer stack's key
    (``[<prefix>.]encoder.layers.<name>``) is filled from the per-layer ``...encoder.layers.<i>.<name>``.
    Returns the global keys filled (every one outside ``skip_prefix``: a missing one is an error)."""
    return set(fill_by_global_key(model, lambda key, shape: _global_value(full, key, shape),
                                  lambda key, _: not (skip_prefix and key.startswith(skip_prefix))))


def _global_value(full: dict[str, torch.Tensor], key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Global key ``key``'s whole tensor from the per-layer state dict ``full``, zero-padded to ``shape``'s rows
    where the vocabulary padding differs."""
    stack = _LAYER_STACK.match(key)
    if key in full:
        value = full[key]
    elif stack is not None:
        layers_key, rest = stack.groups()
        # a gated MLP's fc1 halves ([x; gate] rows): <name>_w is the first, <name>_v the second
        half = "_wv".index(rest[-1]) - 1 if rest.endswith(("weight_w", "weight_v")) else None
        rest = rest[:-2] if half is not None else rest
        # the local spec checkpoints its LayerNorms under Transformer Engine's fused names
        rest = TE_ALIASES.get(rest, rest) if f"{layers_key}0.{rest}" not in full else rest
        layers = [full[f"{layers_key}{i}.{rest}"] for i in range(shape[0])]
        value = torch.stack(layers if half is None else [t.chunk(2)[half] for t in layers])
    else:
        raise CheckpointError(f"weight {key} is missing from the source")
    if tuple(value.shape) != shape:  # vocabulary padding differs: zero-pad the rows
        if value.shape[1:] != shape[1:] or value.shape[0] > shape[0]:
            raise CheckpointError(f"weight {key} has shape {tuple(value.shape)} in the source but "
                                  f"{shape} in this model (different head or model size?)")
        pad = torch.zeros(shape, dtype=value.dtype)
        pad[: value.shape[0]] = value
        value = pad
    return value
