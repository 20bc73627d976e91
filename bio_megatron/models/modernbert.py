"""ModernBERT (Warner et al. 2024; BioClinical ModernBERT 2025) on megatron-core.

What ModernBERT changes in pre-LN BERT, and where it lives here (everything else is megatron-core's own local
spec: ``TransformerLayer``, ``SelfAttention``, the tensor-parallel linears, the gated ``MLP``):

- **No position table**: rotary embeddings on queries and keys, with one base on global layers
  (``model.global_rope_theta``, 160,000) and another on local ones (``model.local_rope_theta``, 10,000).
  megatron-core computes ONE rotary table per model and hands it to every layer, and its ``RotaryEmbedding`` moves
  its frequencies to a GPU on first use; :class:`RopeSelfAttention` (megatron's ``SelfAttention``) makes its own
  table from its layer's base and hands it to megatron's ``apply_rotary_pos_emb`` (non-interleaved halves, as HF).
- **Local attention**: every layer but each ``model.global_attn_every_n_layers``-th (0-based index 0, N, 2N, ...)
  sees only keys within ``model.local_attention // 2`` positions. megatron-core's own ``window_size`` is a causal
  (decoder) window and counts layers from 1; :class:`WindowedDotProductAttention` (megatron's unfused
  ``DotProductAttention``) adds the symmetric band to the padding mask on local layers instead.
- **GeGLU MLP, bias-free**: megatron's ``gated_linear_unit`` with exact GELU (``act(x) * gate``, the first half of
  fc1's rows is ``x``, as HF's ``Wi``) and ``add_bias_linear=False``; LayerNorms without bias
  (:class:`BiasFreeLayerNorm`). Layer 0 applies no attention LayerNorm (the embedding is normalised already).
- **Embedding**: the word table, LayerNorm, dropout (no token types). **Final norm** after the last layer.
- **MLM head** (HF ``ModernBertPredictionHead`` + decoder): dense H -> H (no bias), GELU, LayerNorm, then a
  vocab-parallel output layer whose weight is the word embedding plus its own bias.

State names (TP1; :mod:`bio_megatron.families.modernbert` maps them to HF)::

    embedding.word_embeddings.weight [V, H], embedding.norm.weight [H]
    encoder.layers.{i}.input_layernorm.weight (layer 0's is never applied: :class:`UnappliedNorm`), self_attention.linear_qkv.weight [3H, H] (rows per head:
        [q_h0, k_h0, v_h0, q_h1, ...]), self_attention.linear_proj.weight, pre_mlp_layernorm.weight,
        mlp.linear_fc1.weight [2F, H] ([x; gate]), mlp.linear_fc2.weight [H, F]
    encoder.final_layernorm.weight, lm_head.dense.weight, lm_head.norm.weight, output_layer.bias [V]

Pipeline parallelism is megatron-core's: :class:`ModernBertModel` is a ``LanguageModule`` split by stage (embedding
on the first, this stage's layers of the ``TransformerBlock``, final norm + MLM head + output layer on the last),
the output layer tied to the word embeddings across stages by ``setup_embeddings_and_output_layer`` and the
embedding group's gradient all-reduce in ``finalize_model_grads``. Each layer's global/local choice and RoPE base
come from its GLOBAL layer number (megatron adds the stage's offset), so a layer is the same on any stage.
Sequence parallelism is refused by the config (``config/family_keys.py::modernbert_problems``).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (TransformerBlock, TransformerBlockSubmodules,
                                                         get_num_layers_to_build)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.models.attention import is_packed, packed_attention_mask, packed_position_ids
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.models.bert import mask_padded_vocab, transformer_config
from bio_megatron.models.init import on_device

__all__ = ["BiasFreeLayerNorm", "ModernBertModel", "ModernBertTaskHead", "RopeSelfAttention",
           "WindowedDotProductAttention", "build_modernbert_model", "is_global_layer", "modernbert_task_encoder",
           "modernbert_task_head", "modernbert_transformer_config"]

DEFAULTS = {"global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0, "local_attention": 128,
            "global_attn_every_n_layers": 3}  # ModernBERT's published values (HF ModernBertConfig's defaults)


def setting(m: ModelConfig, key: str):
    value = getattr(m, key, None)
    return DEFAULTS[key] if value is None else value


def is_global_layer(layer_number: int, every: int) -> bool:
    """megatron's 1-based (global) layer number -> whether it attends globally (HF: 0-based index % N == 0)."""
    return (layer_number - 1) % every == 0


class BiasFreeLayerNorm(nn.LayerNorm):
    """ModernBERT's LayerNorm (``norm_bias: false``), built as megatron builds its norms."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__(hidden_size, eps=eps, bias=False)


class UnappliedNorm(BiasFreeLayerNorm):
    """Layer 0's attention "LayerNorm": ModernBERT applies none there (the embedding was just normalised), but
    megatron checkpoints each per-layer tensor (and its optimizer state) as one entry with a layer axis, which
    must hold every layer. So layer 0 keeps a weight (ones; its gradient is zero, and LayerNorm weights get no
    weight decay, so it stays ones) and passes its input through."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def rope_angles(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """``[..., dim]`` angles ``pos * base^(-2i/dim)`` of integer ``positions`` [...], repeated for both halves."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    return torch.cat((freqs, freqs), dim=-1)


def rope_table(seq: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """megatron's rotary layout [s, 1, 1, dim] for positions 0 .. seq-1."""
    return rope_angles(torch.arange(seq, device=device), dim, base)[:, None, None, :]


class RopeSelfAttention(SelfAttention):
    """megatron's self-attention with this layer's own rotary base (global or local)."""

    def __init__(self, config: TransformerConfig, submodules, layer_number: int, *args, rope_bases=(1e4, 1e4),
                 global_every: int = 1, **kwargs):
        super().__init__(config, submodules, layer_number, *args, **kwargs)
        self.rope_base = float(rope_bases[0] if is_global_layer(self.layer_number, global_every) else rope_bases[1])
        self.positions: torch.Tensor | None = None
        """[b, s] position ids restarting per packed document, set by the model for a packed batch (else None:
        0 .. s-1 in every row)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        if self.positions is None:
            table = rope_table(hidden_states.shape[0], self.config.kv_channels, self.rope_base, hidden_states.device)
        else:  # each row's own positions, [s, b, 1, d]: computed from them, no table to size (no GPU sync per layer)
            table = rope_angles(self.positions.t(), self.config.kv_channels, self.rope_base).unsqueeze(2)
        kwargs["rotary_pos_emb"] = (table, table)
        return super().forward(hidden_states, attention_mask, **kwargs)


class WindowedDotProductAttention(DotProductAttention):
    """megatron's unfused attention; on local layers keys further than ``half_window`` positions away are masked
    too (ModernBERT's bidirectional sliding window, ``|i - j| <= local_attention // 2``)."""

    def __init__(self, config: TransformerConfig, layer_number: int, *args, half_window: int = 64,
                 global_every: int = 1, **kwargs):
        super().__init__(config, layer_number, *args, **kwargs)
        self.half_window = None if is_global_layer(layer_number, global_every) else half_window

    def forward(self, query, key, value, attention_mask, *args, **kwargs):
        if self.half_window is not None:
            pos = torch.arange(query.shape[0], device=query.device)
            far = ((pos[:, None] - pos[None, :]).abs() > self.half_window)[None, None]  # [1, 1, sq, sk]
            attention_mask = far if attention_mask is None else (attention_mask | far)
        return super().forward(query, key, value, attention_mask, *args, **kwargs)


def modernbert_transformer_config(m: ModelConfig, dtype: torch.dtype = torch.float32) -> TransformerConfig:
    """BERT's TransformerConfig with ModernBERT's GeGLU (exact GELU), no linear biases, unfused bias-activation,
    and no fused masked softmax even where Apex built it: the global layers pass the key-padding mask [b,1,1,s],
    which the fused kernel refuses (it wants [b,1,s,s]); torch's softmax broadcasts it."""
    cfg = transformer_config(m, dtype)
    return dataclasses.replace(cfg, gated_linear_unit=True, add_bias_linear=False, add_qkv_bias=False,
                               activation_func=F.gelu, bias_activation_fusion=False, masked_softmax_fusion=False)


def block_spec(m: ModelConfig, config: TransformerConfig) -> TransformerBlockSubmodules:
    """This pipeline stage's layer specs on megatron-core's local BERT layer (global layer 0's attention LayerNorm
    unapplied). The global/local choice and rotary base are made per layer from megatron's global layer number."""
    every = setting(m, "global_attn_every_n_layers")
    layer = copy.deepcopy(bert_layer_local_spec)
    sub = layer.submodules
    sub.input_layernorm = sub.pre_mlp_layernorm = BiasFreeLayerNorm
    attn = sub.self_attention
    attn.module = RopeSelfAttention
    attn.params = {**attn.params, "rope_bases": (setting(m, "global_rope_theta"), setting(m, "local_rope_theta")),
                   "global_every": every}
    attn.submodules.core_attention = ModuleSpec(module=WindowedDotProductAttention, params={
        "half_window": setting(m, "local_attention") // 2, "global_every": every})
    first = copy.deepcopy(layer)
    first.submodules.input_layernorm = UnappliedNorm
    pp_rank = ps.get_pipeline_model_parallel_rank()
    offset = get_transformer_layer_offset(config, None, pp_rank)  # this stage's first global layer index
    count = get_num_layers_to_build(config, None, pp_rank)
    return TransformerBlockSubmodules(layer_specs=[first if offset + i == 0 else layer for i in range(count)],
                                      layer_norm=BiasFreeLayerNorm)


class ModernBertEmbedding(LanguageModelEmbedding):
    """The vocab-parallel word table, then LayerNorm and dropout (HF ``ModernBertEmbeddings``); positions are
    rotary (in attention) and there are no token types, so both arguments are ignored."""

    def __init__(self, config: TransformerConfig, vocab_size: int, max_sequence_length: int):
        super().__init__(config=config, vocab_size=vocab_size, max_sequence_length=max_sequence_length,
                         position_embedding_type="rope", num_tokentypes=0)
        self.norm = BiasFreeLayerNorm(config, config.hidden_size, config.layernorm_epsilon)
        self.rope_layers: list[RopeSelfAttention] = []
        """A fine-tuning model's attention layers (a plain list: not submodules), handed the ``position_ids`` the
        task model passes here (restarting per example in a packed batch: ``tasks/packing.py``)."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                tokentype_ids: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        for attention in self.rope_layers:
            attention.positions = position_ids
        words = self.word_embeddings(input_ids).transpose(0, 1).contiguous()  # [s, b, h]
        return self.embedding_dropout(self.norm(words))


class ModernBertHead(nn.Module):
    """HF ``ModernBertPredictionHead``: dense (H -> H, no bias), GELU, LayerNorm (no bias)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.norm = BiasFreeLayerNorm(config, config.hidden_size, config.layernorm_epsilon)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(hidden)))


class ModernBertTaskHead(nn.Module):
    """HF ``ModernBertFor{Token,Sequence}Classification`` / ``...QuestionAnswering``'s head: ModernBERT's prediction
    head (dense H -> H without bias, GELU, bias-free LayerNorm), dropout, then a linear classifier with bias.
    ``pooling``: sequence classification first reads the [CLS] position (``cls``, HF ``classifier_pooling: cls``) or
    the mean over the example's real tokens (``mean``: the padding mask ``TaskModel`` passes when
    ``reads_padding_mask``); None (token classification, QA) keeps every position. Names (``dense``, ``norm``,
    ``classifier``) are HF's under ``head.`` (:mod:`bio_megatron.families.modernbert` maps them)."""

    use_transformer_init = True  # N(0, init_method_std) weights, unit norm gain, zero bias (models/init.py)

    def __init__(self, hidden_size: int, num_classes: int, dropout: float, eps: float, pooling: str | None):
        super().__init__()
        self.pooling = pooling
        self.reads_padding_mask = pooling == "mean"
        self.dense = nn.Linear(hidden_size, hidden_size, bias=False)
        self.norm = nn.LayerNorm(hidden_size, eps=eps, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, hidden: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooling == "cls":
            hidden = hidden[:, 0]
        elif self.pooling == "mean":  # as HF: padded positions out of the sum and the count
            weight = padding_mask.unsqueeze(-1).to(hidden.dtype)
            hidden = (hidden * weight).sum(dim=1) / weight.sum(dim=1)
        return self.classifier(self.dropout(self.norm(F.gelu(self.dense(hidden)))))


def modernbert_task_head(task: str, model_cfg, hidden_size: int, num_classes: int) -> ModernBertTaskHead:
    """A ModernBERT encoder's task head (``models.heads.build_head`` for ``model.family: modernbert``): QA gives two
    logits per token (start, end); the dropout is the task's ``fc_dropout`` (``model.head`` for NER and QA,
    ``model.classifier_head`` for RE and classify, whose ``pooling`` says cls or mean)."""
    sequence = task in ("re", "classify")
    block = model_cfg.classifier_head if sequence else model_cfg.head
    pooling = getattr(block, "pooling", "cls") if sequence else None
    return ModernBertTaskHead(hidden_size, 2 if task == "qa" else num_classes, block.fc_dropout,
                              model_cfg.layernorm_epsilon, pooling)


def attention_mask_for(padding_mask: torch.Tensor) -> torch.Tensor:
    """[b, s] (1 = token) -> megatron's [b, 1, s, s] boolean mask (True = masked out)."""
    mask = padding_mask.unsqueeze(1)
    return (mask.unsqueeze(2) * mask.unsqueeze(3)) < 0.5


class ModernBertModel(LanguageModule):
    """ModernBERT for MLM pretraining at TP x PP x DP, called as megatron-core's ``BertModel``:
    ``forward(input_ids, attention_mask, tokentype_ids, lm_labels)`` returns on the last stage the per-token MLM loss
    [b, s] (or, without labels, this rank's vocabulary slice of the logits [b, s, V/TP]) and None (no NSP); on the
    other stages the hidden states [s, b, H] for the next one (whose input arrives by :meth:`set_input_tensor`)."""

    def __init__(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32,
                 pre_process: bool | None = None, post_process: bool | None = None):
        super().__init__(config=modernbert_transformer_config(m, dtype))
        self.model_type = ModelType.encoder_or_decoder
        self.pre_process = ps.is_pipeline_first_stage() if pre_process is None else pre_process
        self.post_process = ps.is_pipeline_last_stage() if post_process is None else post_process
        self.share_embeddings_and_output_weights = True
        self.true_vocab_size = vocab_size
        self.vocab_size = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
        if self.pre_process:
            self.embedding = ModernBertEmbedding(self.config, self.vocab_size, m.max_position_embeddings)
        self.encoder = TransformerBlock(config=self.config, spec=block_spec(m, self.config),
                                        pre_process=self.pre_process, post_process=self.post_process)
        if self.post_process:
            self.lm_head = ModernBertHead(self.config)
            # the vocab-parallel decoder with its own bias; its weight is the word embedding, passed at call time on
            # a stage that has it, else a copy megatron keeps equal to it (setup_embeddings_and_output_layer)
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                self.config.hidden_size, self.vocab_size, config=self.config, init_method=self.config.init_method,
                bias=True, skip_bias_add=False, gather_output=False, skip_weight_param_allocation=self.pre_process)
        if self.pre_process or self.post_process:
            self.setup_embeddings_and_output_layer()

    def set_input_tensor(self, input_tensor) -> None:
        """megatron-core's schedules hand the previous stage's output here (None on the first stage)."""
        if not isinstance(input_tensor, list):
            input_tensor = [input_tensor]
        assert len(input_tensor) == 1, "input_tensor should only be length 1 for ModernBERT"
        self.encoder.set_input_tensor(input_tensor[0])

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """This stage's output [s, b, H] (final-normed on the last stage). A packed batch (``data/packing.py``: the
        padding mask numbers each row's documents) attends within each document only, with rotary positions
        restarting per document; every stage derives both from the padding mask it reads too."""
        packed = is_packed(attention_mask)
        positions = packed_position_ids(attention_mask) if packed else None
        for module in self.encoder.modules():
            if isinstance(module, RopeSelfAttention):
                module.positions = positions
        mask = packed_attention_mask(attention_mask) if packed else attention_mask_for(attention_mask)
        hidden = self.embedding(input_ids=input_ids) if self.pre_process else None  # else the block's input tensor
        return self.encoder(hidden_states=hidden, attention_mask=mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokentype_ids: torch.Tensor | None = None,
                lm_labels: torch.Tensor | None = None):
        hidden = self.encode(input_ids, attention_mask)
        if not self.post_process:
            return hidden
        return self.mlm_output(self.lm_head(hidden), lm_labels), None

    def mlm_output(self, head_out: torch.Tensor, lm_labels: torch.Tensor | None) -> torch.Tensor:
        """[s, b, H] from the MLM head -> this rank's vocabulary slice of the logits [b, s, V/TP] (padded entries
        -inf), or with labels the per-token MLM loss [b, s]."""
        logits, _ = self.output_layer(head_out, weight=self.shared_embedding_or_output_weight())
        logits = mask_padded_vocab(logits, self.true_vocab_size)
        if lm_labels is None:
            return logits.transpose(0, 1).contiguous()
        loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), lm_labels.transpose(0, 1).contiguous())
        return loss.transpose(0, 1).contiguous()


def build_modernbert_model(m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32) -> ModernBertModel:
    """This rank's stage of ModernBERT (weights NOT initialised: call ``init_weights``, as for ``build_model``)."""
    return on_device(ModernBertModel(m, vocab_size, dtype), dtype)


def modernbert_task_encoder(m: ModelConfig, padded_vocab: int, dtype: torch.dtype, pre_process: bool,
                            post_process: bool) -> tuple[nn.Module | None, TransformerBlock]:
    """(embedding on the first stage else None, this stage's encoder layers) of a fine-tuning model under the
    pretraining model's names."""
    config = modernbert_transformer_config(m, dtype)
    block = TransformerBlock(config=config, spec=block_spec(m, config), pre_process=pre_process,
                             post_process=post_process)
    if not pre_process:
        return None, block
    embedding = ModernBertEmbedding(config, padded_vocab, m.max_position_embeddings)
    # a packed batch's positions reach the layers of the first stage only: packing is PP 1 (config/packing.py)
    embedding.rope_layers = [mod for mod in block.modules() if isinstance(mod, RopeSelfAttention)]
    return embedding, block
