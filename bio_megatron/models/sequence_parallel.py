"""LayerNorms for megatron-core's sequence parallelism on the local layer spec (no apex, no Transformer Engine).

With ``sequence_parallel`` megatron-core splits the activations between the tensor-parallel linears along the
sequence: the embedding scatters its output over the TP ranks, each column-parallel linear all-gathers its input
and each row-parallel linear reduce-scatters its output (``tensor_parallel.mappings``), the LM head's output
layer gathers the sequence back and BERT's pooler gathers before pooling. Everything between the linears
(LayerNorms, dropout, residual adds) then runs on 1/TP of the tokens, so a LayerNorm's weight gradient on one
rank covers only its share of the tokens: megatron's ``finalize_model_grads`` sums the gradients of every
parameter tagged ``sequence_parallel`` over the TP group (``_allreduce_non_tensor_model_parallel_grads``).

megatron's LayerNorms tag their weights themselves (apex's ``FusedLayerNorm``, Transformer Engine's), but its
PyTorch fallback ``WrappedTorchNorm``, the one the local spec uses without apex, asserts that sequence
parallelism is off. :class:`SequenceParallelLayerNorm` is ``torch.nn.LayerNorm`` with those tags (the same
parameters and state-dict keys, so checkpoints do not change), put wherever the fallback would be built:

* in a layer spec (pre-LN's input / pre-MLP norms, post-LN's post-attention / post-MLP norms):
  :func:`sequence_parallel_spec`;
* where megatron picks the fallback at construction time (the block's final LayerNorm in ``transformer_block``,
  the MLM head's in ``bert_lm_head``): :func:`fallback_norms` points those module names at it while a model is
  built, and only then;
* post-LN's embedding LayerNorm: :func:`norm_class`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from typing import Iterator

import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig

SP_ATTR = "sequence_parallel"  # what finalize_model_grads looks for on a parameter


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` built like megatron's norms (``config``, ``hidden_size``, ``eps``) whose weight and
    bias carry ``sequence_parallel`` = ``config.sequence_parallel``, as apex's ``FusedLayerNorm`` sets them."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused) -> None:
        if config.normalization != "LayerNorm":
            raise ValueError(f"SequenceParallelLayerNorm is a LayerNorm, not {config.normalization}")
        super().__init__(hidden_size, eps=eps)
        for p in (self.weight, self.bias):
            setattr(p, SP_ATTR, bool(config.sequence_parallel))


def norm_class(config: TransformerConfig, default: type) -> type:
    """``default`` (a LayerNorm builder), or :class:`SequenceParallelLayerNorm` where ``default`` is megatron's
    PyTorch fallback and the config is sequence-parallel."""
    if config.sequence_parallel and default is WrappedTorchNorm:
        return SequenceParallelLayerNorm
    return default


def sequence_parallel_spec(spec: ModuleSpec) -> ModuleSpec:
    """A copy of a local-spec layer ``spec`` with every ``WrappedTorchNorm`` submodule replaced by
    :class:`SequenceParallelLayerNorm` (Transformer Engine's spec has none and is returned unchanged)."""
    spec = copy.deepcopy(spec)
    sub = spec.submodules
    if dataclasses.is_dataclass(sub):
        for f in dataclasses.fields(sub):
            if getattr(sub, f.name) is WrappedTorchNorm:
                setattr(sub, f.name, SequenceParallelLayerNorm)
    return spec


@contextlib.contextmanager
def fallback_norms(config: TransformerConfig) -> Iterator[None]:
    """While a model is built: the final LayerNorm of megatron's ``TransformerBlock`` and the MLM head's
    LayerNorm are :class:`SequenceParallelLayerNorm` where megatron would build its PyTorch fallback (both modules
    choose the norm class from a module-level name at construction). A no-op without sequence parallelism."""
    if not config.sequence_parallel:
        yield
        return
    from bio_megatron.parallel import seam

    with seam.install("build", norm_for=functools.partial(norm_class, config)):  # the seam's norm_swap rows
        yield
