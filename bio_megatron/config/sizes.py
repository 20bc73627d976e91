"""Model sizes: the one table every other part of the project reads.

Megatron BERT is pre-LayerNorm with learned absolute positions. 345m is confirmed by NeMo's config
and the NGC model card; the 800m and 1.2b shapes are not published and are ASSUMED (ANCHORS.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    status: str  # "confirmed" | "assumed" | "test"


SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, status="test"),
    "345m": ModelShape(num_layers=24, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096,
                       status="confirmed"),
    "800m": ModelShape(num_layers=40, hidden_size=1280, num_attention_heads=20, ffn_hidden_size=5120,
                       status="assumed"),
    "1.2b": ModelShape(num_layers=24, hidden_size=2048, num_attention_heads=32, ffn_hidden_size=8192,
                       status="assumed"),
    # BERT's own shapes (Devlin et al. 2019), used by PubMedBERT, BioM-BERT, bio-lm RoBERTa, BioELECTRA.
    "base": ModelShape(num_layers=12, hidden_size=768, num_attention_heads=12, ffn_hidden_size=3072,
                       status="confirmed"),
    "large": ModelShape(num_layers=24, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096,
                        status="confirmed"),
}


def size_row(shape: ModelShape) -> str:
    """The first row of :data:`SIZES` with ``shape``'s dimensions, or ``custom``: a NeMo config's 12 x 768 encoder is
    ``base`` whatever ``model.size`` it left at its default."""
    dims = (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.ffn_hidden_size)
    return next((name for name, row in SIZES.items()
                 if (row.num_layers, row.hidden_size, row.num_attention_heads, row.ffn_hidden_size) == dims), "custom")


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
    """Megatron pads the embedding table to a multiple of ``divisible_by * TP`` (28,996 -> 29,056 at TP=1)."""
    multiple = divisible_by * tensor_parallel_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def parameter_count(shape: ModelShape, padded_vocab: int, max_position_embeddings: int = 512,
                    num_tokentypes: int = 2, binary_head: bool = False) -> int:
    """Exact parameter count of megatron-core's BertModel (tied input/output embedding counted once)."""
    h, f, layers = shape.hidden_size, shape.ffn_hidden_size, shape.num_layers
    embeddings = (padded_vocab + max_position_embeddings + num_tokentypes) * h
    per_layer = (
        2 * h                  # input LayerNorm
        + 3 * h * h + 3 * h    # fused QKV
        + h * h + h            # attention output projection
        + 2 * h                # pre-MLP LayerNorm
        + h * f + f            # fc1
        + f * h + h            # fc2
    )
    final_ln = 2 * h
    lm_head = h * h + h + 2 * h + padded_vocab  # dense + LayerNorm + output bias (weight tied)
    # megatron-core builds the pooler (dense + tanh over [CLS]) only together with the binary head.
    pooler_and_binary = (h * h + h + 2 * h + 2) if binary_head else 0  # pooler dense + 2-way head
    return embeddings + layers * per_layer + final_ln + lm_head + pooler_and_binary
