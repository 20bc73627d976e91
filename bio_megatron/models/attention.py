"""Core attention for megatron-core's local layer spec built on PyTorch's ``scaled_dot_product_attention``.

Without Transformer Engine, megatron-core's local spec computes attention unfused (explicit [b, n, s, s]
scores, softmax, dropout, bmm). On GPU this module lets PyTorch pick its flash / memory-efficient
kernels instead. The mask it receives is megatron's key-padding mask ``[b, 1, 1, s]`` with True = masked, or, for
rows packed from several documents, the block-diagonal ``[b, 1, s, s]`` of :func:`packed_attention_mask`.
Numerically checked against the unfused path in ``tests/test_attention.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


def is_packed(attention_mask: torch.Tensor) -> bool:
    """Whether a ``padding_mask`` numbers packed documents (1, 2, ...; ``data/packing.py``) rather than holding
    1 / 0 per token / padding. A row of one document is the same either way."""
    return attention_mask.dtype != torch.bool and bool((attention_mask > 1).any())


def packed_attention_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[b, 1, s, s]``, True = masked: a token attends only to tokens of its own document (``segments`` [b, s]:
    1, 2, ... per document, 0 = padding). Padding forms a block of its own, so no query row is entirely masked
    (SDPA returns NaN for such a row); no real token ever attends to it, nor it to them."""
    return (segments[:, None, :, None] != segments[:, None, None, :])


def packed_position_ids(segments: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` position ids restarting at 0 at every document of ``segments`` (padding counts on from its
    start: no real token reads those rows)."""
    s = segments.shape[1]
    idx = torch.arange(s, device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def unpack_rows(hidden: torch.Tensor, unpack: torch.Tensor) -> torch.Tensor:
    """``[n, L, h]`` per-example states from packed ``hidden`` ``[b, s, h]``: ``unpack`` ``[n, L]`` holds each
    example position's flat index ``row * s + position`` in the packed batch, -1 past its end (zeros there)."""
    b, s, h = hidden.shape
    flat = torch.cat([hidden.reshape(b * s, h), hidden.new_zeros(1, h)])
    return flat[torch.where(unpack >= 0, unpack, b * s)]


class SDPACoreAttention(MegatronModule):
    """Drop-in ``core_attention`` for ``SelfAttention``: [sq, b, np, hn] q/k/v -> [sq, b, np*hn] context."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism")
        tp = config.tensor_model_parallel_size
        self.heads_per_partition = divide(config.num_attention_heads, tp)
        self.head_dim = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params=None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPACoreAttention supports neither packed sequences nor attention bias")
        sq, b = query.shape[0], query.shape[1]
        # [s, b, n, h] -> [b, n, s, h]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        # SDPA: True = attend; megatron: True = masked. The model passes None for batches without
        # padding (one check per forward, not a GPU sync per layer), which lets PyTorch pick flash.
        mask = ~attention_mask if attention_mask is not None else None
        dropout_p = self.dropout_p if self.training else 0.0
        if dropout_p > 0.0:
            with tensor_parallel.get_cuda_rng_tracker().fork():  # per-TP-rank dropout stream, as in megatron
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                     scale=self.softmax_scale)
        else:
            # No mask (fully packed batch) lets PyTorch use the flash kernel.
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.softmax_scale)
        # [b, n, s, h] -> [s, b, n*h]
        return ctx.permute(2, 0, 1, 3).reshape(sq, b, self.heads_per_partition * self.head_dim)
