"""ALBERT (Lan et al. 2020; BioM-ALBERT, BioM-Transformers §3.1) on megatron-core.

What ALBERT changes in post-LN BERT, and where it lives here:

- **Factorised embedding**: word, position and token-type tables of width ``E`` (``model.embedding_size``; 128 in
  every published ALBERT), summed and normalised at width E by megatron-core's own ``LanguageModelEmbedding`` (built
  from a TransformerConfig of width E, so the vocabulary is split over TP exactly as BERT's), then one linear
  E -> H. The projection is a replicated ``nn.Linear`` held by the encoder (HF keeps it there too:
  ``encoder.embedding_hidden_mapping_in``): the embedding's output is whole on every TP rank, and the gradient that
  reaches it is whole too (the first attention's column-parallel linear all-reduces its input gradient), so every
  rank computes the same update, as for BERT's LayerNorms.
- **Cross-layer sharing**: ONE megatron-core post-LN ``TransformerLayer`` (:mod:`bio_megatron.models.post_ln`),
  applied ``num_layers`` times by :class:`AlbertBlock`, which has ``TransformerBlock``'s forward interface.
  Its tensor-parallel split is megatron-core's own; its state has no layer axis (``encoder.layer.*``).
- **gelu_new** (tanh approximation) in the MLP and the MLM head, as HF's ``hidden_act: gelu_new``.
- **MLM head**: dense H -> E, gelu_new, LayerNorm(E), then a vocab-parallel output layer whose weight is the word
  embedding (E wide) plus its own bias; padded vocabulary entries are kept out of the softmax as in BERT.
- **Sentence-order prediction**: pooler (dense H -> H, tanh) on [CLS] and a 2-way linear. The data are
  megatron-core's BERT samples with the binary head on: ``BERTMaskedWordPieceDataset`` builds segment A and
  segment B from consecutive sentences of one document and, for ``is_random`` samples, swaps them
  (``split_A, split_B = split_B, split_A``) -- ALBERT's SOP, not BERT's random-document NSP.

State names (TP1, the keys :mod:`bio_megatron.families.albert` maps to HF)::

    embedding.{word,position,tokentype}_embeddings.weight [*, E], embedding.layernorm.{weight,bias} [E]
    encoder.embedding_projection.{weight,bias} [H, E]
    encoder.layer.{self_attention.linear_qkv, self_attention.linear_proj, post_attention_layernorm,
                   mlp.linear_fc1, mlp.linear_fc2, post_mlp_layernorm}.*
    lm_head.dense [E, H], lm_head.layer_norm [E], output_layer.bias [V]   (decoder weight = word embeddings)
    pooler.dense [H, H], binary_head [2, H]                                  (with model.bert_binary_head)

Pipeline parallelism is refused by the config (``config/family_keys.py::albert_problems``): the one layer's weights would live on
every stage and need their gradients summed across stages, which megatron-core does only for the word embeddings.
Sequence parallelism and full activation recompute (``TransformerBlock``'s machinery) are refused there too.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import make_viewless_tensor
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.models.bert import layer_spec, transformer_config
from bio_megatron.models.post_ln import add_embedding_layernorm, is_post_ln
from bio_megatron.models.init import on_device
from bio_megatron.models.tied_mlm import TiedMLMModel
from bio_megatron.utils.errors import ConfigError

__all__ = ["AlbertBlock", "AlbertModel", "albert_embedding", "albert_parameter_count", "albert_task_encoder",
           "albert_transformer_config", "build_albert_model", "gelu_new"]


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (HF's ``gelu_new``, ALBERT's and GPT-2's activation)."""
    return F.gelu(x, approximate="tanh")


def embedding_width(m: ModelConfig) -> int:
    """E: ``model.embedding_size``, or the hidden size when unset (no factorisation)."""
    return m.embedding_size or m.shape().hidden_size


def albert_transformer_config(m: ModelConfig, dtype: torch.dtype = torch.float32) -> TransformerConfig:
    """BERT's TransformerConfig with ALBERT's activation, which the MLP applies itself (BERT's config already has
    megatron's fused bias-GELU off: a fixed tanh approximation, whichever activation is configured)."""
    cfg = transformer_config(m, dtype)
    cfg.activation_func = gelu_new if (m.hidden_act or "gelu_new") == "gelu_new" else F.gelu
    return cfg


def albert_embedding(m: ModelConfig, padded_vocab: int, dtype: torch.dtype = torch.float32) -> LanguageModelEmbedding:
    """megatron-core's embedding at width E (vocab-parallel word table, positions, token types) with BERT's
    LayerNorm on the sum, at width E too. Its config differs from the encoder's only in the width (and TP heads:
    the embedding has no attention, and E need not divide into the encoder's heads)."""
    e = embedding_width(m)
    narrow = dataclasses.replace(m, hidden_size=e, ffn_hidden_size=4 * e,
                                 num_attention_heads=m.tensor_model_parallel_size)
    config = transformer_config(narrow, dtype)
    embedding = LanguageModelEmbedding(config=config, vocab_size=padded_vocab,
                                       max_sequence_length=m.max_position_embeddings,
                                       position_embedding_type="learned_absolute", num_tokentypes=m.num_tokentypes)
    add_embedding_layernorm(embedding)
    return embedding


class AlbertBlock(MegatronModule):
    """The E -> H projection and one shared post-LN layer applied ``config.num_layers`` times, called like
    megatron-core's ``TransformerBlock`` (``hidden_states`` [s, b, E], ``attention_mask``) -> [s, b, H]."""

    def __init__(self, config: TransformerConfig, spec, embedding_size: int):
        super().__init__(config=config)
        if not is_post_ln(spec):
            raise ConfigError("ALBERT's shared layer is post-LN: its layer spec must be post_ln_layer_spec")
        self.embedding_projection = nn.Linear(embedding_size, config.hidden_size)
        self.layer = build_module(spec, config=config, layer_number=1)
        self.input_tensor = None

    def set_input_tensor(self, input_tensor) -> None:
        """megatron's schedules call this with the previous stage's output: always None here (PP 1)."""
        self.input_tensor = input_tensor

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        hidden = self.embedding_projection(hidden_states)
        for _ in range(self.config.num_layers):
            hidden, _ = self.layer(hidden_states=hidden, attention_mask=attention_mask)
        # as TransformerBlock: the output may be a view of a tensor megatron's schedules later free
        return make_viewless_tensor(inp=hidden, requires_grad=True, keep_graph=True)


class AlbertMLMHead(nn.Module):
    """HF ``AlbertMLMHead`` up to the decoder: dense (H -> E), gelu_new, LayerNorm(E)."""

    def __init__(self, hidden: int, embedding: int, eps: float, act=gelu_new):
        super().__init__()
        self.dense = nn.Linear(hidden, embedding)
        self.layer_norm = nn.LayerNorm(embedding, eps=eps)
        self.act = act

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.act(self.dense(hidden)))


class AlbertPooler(nn.Module):
    """HF ``AlbertModel.pooler``: dense (H -> H) + tanh on the first ([CLS]) position."""

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[0]))  # [s, b, h] -> [b, h]


def attention_mask_for(padding_mask: torch.Tensor, mask_dims: str) -> torch.Tensor:
    """[b, s] padding mask (1 = token) -> megatron's boolean mask (True = masked out): [b,1,s,s] for the unfused
    attention, [b,1,1,s] (key padding) for SDPA, as BertModel and TaskModel build it."""
    mask = padding_mask.unsqueeze(1)
    mask = (mask.unsqueeze(2) * mask.unsqueeze(3)) if mask_dims == "b1ss" else mask.unsqueeze(1)
    return mask < 0.5


def mask_dims_of(spec) -> str:
    core = spec.submodules.self_attention.submodules.core_attention
    return "b1ss" if core is DotProductAttention else "b11s"


class AlbertModel(TiedMLMModel):
    """ALBERT for pretraining at TP x DP (PP 1), called as megatron-core's ``BertModel``:
    ``forward(input_ids, attention_mask, tokentype_ids, lm_labels)`` returns the per-token MLM loss [b, s] (or,
    without labels, this rank's vocabulary slice of the logits [b, s, V/TP]) and the SOP logits [b, 2] or None."""

    def __init__(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32):
        super().__init__(albert_transformer_config(m, dtype), m, vocab_size, "albert")
        spec = layer_spec(dataclasses.replace(m, transformer_block_type="post_ln"))
        self.mask_dims = mask_dims_of(spec)
        e = embedding_width(m)
        self.embedding = albert_embedding(m, self.vocab_size, dtype)
        self.encoder = AlbertBlock(self.config, spec, e)
        self.lm_head = AlbertMLMHead(self.config.hidden_size, e, self.config.layernorm_epsilon,
                                     self.config.activation_func)
        self.make_output_layer(e, self.embedding.config)  # E wide, tied to the E-wide word embeddings
        self.add_binary_head = m.bert_binary_head
        if self.add_binary_head:
            self.pooler = AlbertPooler(self.config.hidden_size)
            self.binary_head = nn.Linear(self.config.hidden_size, 2)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               tokentype_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's last hidden states [s, b, H]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        embedded = self.embedding(input_ids=input_ids, position_ids=positions, tokentype_ids=tokentype_ids)
        return self.encoder(hidden_states=embedded, attention_mask=attention_mask_for(attention_mask, self.mask_dims))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokentype_ids: torch.Tensor | None = None,
                lm_labels: torch.Tensor | None = None):
        hidden = self.encode(input_ids, attention_mask, tokentype_ids)
        binary_logits = self.binary_head(self.pooler(hidden)) if self.add_binary_head else None
        return self.mlm_output(self.lm_head(hidden), lm_labels), binary_logits


def build_albert_model(m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32) -> AlbertModel:
    """This rank's ALBERT (weights NOT initialised: call ``init_weights``, as for ``build_model``)."""
    return on_device(AlbertModel(m, vocab_size, dtype), dtype)


def albert_parameter_count(m: ModelConfig, padded_vocab: int) -> int:
    """Exact parameter count of :class:`AlbertModel` (the shared layer once, the output weight tied)."""
    s, e = m.shape(), embedding_width(m)
    h = s.hidden_size
    head = (h * e + e) + 2 * e + padded_vocab
    binary = (h * h + h + 2 * h + 2) if m.bert_binary_head else 0
    return albert_encoder_parameter_count(m, padded_vocab) + head + binary


def albert_encoder_parameter_count(m: ModelConfig, padded_vocab: int) -> int:
    """The factorised embedding, its E -> H projection and the one shared layer (a fine-tuning model's encoder)."""
    s, e = m.shape(), embedding_width(m)
    h, f = s.hidden_size, s.ffn_hidden_size
    embedding = (padded_vocab + m.max_position_embeddings + m.num_tokentypes) * e + 2 * e
    layer = (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    return embedding + (e * h + h) + layer


def albert_task_encoder(m: ModelConfig, padded_vocab: int, dtype: torch.dtype, pre_process: bool,
                        post_process: bool) -> tuple[nn.Module | None, AlbertBlock]:
    """(embedding, encoder) of a fine-tuning model (``families.task.TaskModel``) under the pretraining model's
    names (``embedding.*``, ``encoder.*``): its checkpoint's shards load into it directly. PP is 1."""
    if not (pre_process and post_process):
        raise ConfigError("model.family albert needs model.pipeline_model_parallel_size=1")
    config = albert_transformer_config(m, dtype)
    spec = layer_spec(dataclasses.replace(m, transformer_block_type="post_ln"))
    return albert_embedding(m, padded_vocab, dtype), AlbertBlock(config, spec, embedding_width(m))
