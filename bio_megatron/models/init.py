"""Weight initialisation that is identical whatever the TP/PP layout.

megatron's own ``use_cpu_initialization`` is TP-invariant but not PP-invariant. Here each parameter is
drawn from its sharded-state-dict entry instead: a generator seeded by (seed, global key) fills the
parameter's *global* shape, and each rank copies its own slice. That covers TP slicing, PP layer
offsets and the tied output-embedding copy on the last stage.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection

import torch
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory


def sharded_parts(sharded: dict):
    """(state-dict key, entry) of a sharded state dict, with a gated MLP's fc1 (megatron's ShardedTensorFactory:
    ModernBERT's GeGLU, [x; gate], each half split over TP) as its two halves, each a view of the parameter under its
    own global key. Initialisation and filling from a checkpoint both walk it, so they agree on every global key."""
    for key, sh in sharded.items():
        if isinstance(sh, ShardedTensorFactory):
            yield from ((key, part) for part in sh.build() if isinstance(part, ShardedTensor))
        else:
            yield key, sh


def _sharded_tensors(model: torch.nn.Module):
    return ((k, sh) for k, sh in sharded_parts(model.sharded_state_dict()) if isinstance(sh, ShardedTensor))


def fill_by_global_key(model: torch.nn.Module, value: Callable[[str, tuple[int, ...]], torch.Tensor],
                       keep: Callable[[str, ShardedTensor], bool]) -> list[str]:
    """Copy into each piece of ``model`` that ``keep(state-dict key, piece)`` accepts its slice of ``value(global key,
    global shape)``; returns the global keys filled, in the model's order. Each key's value is built once for all its
    pieces: a layer stack's key ([layers, ...]) has one piece per layer, and building it per piece cost num_layers
    times the work (57 s to initialise 345m on a 2-core CPU, 10.5 s to fill it from a Hugging Face state)."""
    pieces: dict[str, list[ShardedTensor]] = {}
    for k, sh in _sharded_tensors(model):
        if keep(k, sh):
            pieces.setdefault(sh.key, []).append(sh)
    with torch.no_grad():
        for key, shards in pieces.items():
            full = value(key, tuple(shards[0].global_shape))
            for sh in shards:
                sh.data.copy_(full[sh.global_slice()].reshape(sh.local_shape).to(sh.data.dtype))
    return list(pieces)


def init_value(key: str, shape: tuple[int, ...], seed: int, std: float, num_layers: int) -> torch.Tensor:
    """Megatron BERT's init: N(0, std) weights, std/sqrt(2L) for residual output projections,
    zero biases, unit LayerNorm gains."""
    # Every LayerNorm: pre-LN's input/pre-MLP/final ones (``layer_norm_weight``, ``layernorm.weight``), post-LN's
    # post-attention/post-MLP/embedding ones, the LM head's (``layer_norm.weight``).
    if "norm" in key:
        return torch.ones(shape) if key.endswith("weight") else torch.zeros(shape)
    if key.endswith("bias"):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{key}".encode()))
    if "linear_proj.weight" in key or "linear_fc2.weight" in key:
        std = std / math.sqrt(2.0 * num_layers)
    return torch.randn(shape, generator=g).mul_(std)  # in place: one full-size tensor at a time


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int, std: float, num_layers: int,
                 skip: Collection[str] = frozenset(), only: tuple[str, ...] | None = None) -> None:
    """Every parameter its layout-invariant initial value, except those whose global key is in ``skip`` (filled
    from a checkpoint already: each value depends on its own key only, so the others get what they would anyway);
    ``only``: just the keys starting with one of these prefixes (the modules a source lacks)."""
    fill_by_global_key(model, lambda key, shape: init_value(key, shape, seed, std, num_layers),
                       lambda _, sh: sh.key not in skip and (only is None or sh.key.startswith(only)))


def rank_device() -> torch.device:
    """This rank's GPU when there is one (``init_distributed`` selected it), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def on_device(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` on this rank's GPU when there is one, in ``dtype`` (weights NOT initialised: ``init_weights``)."""
    if torch.cuda.is_available():
        model.cuda(rank_device())
    if dtype != torch.float32:
        model.to(dtype)
    return model
