"""Encoder + task head on megatron-core, at any TP/PP layout: the fine-tuning model of every family.

:class:`TaskModel` holds exactly the parameter names of the family's pretraining encoder (megatron-core's
``BertModel``: ``embedding.*``, ``encoder.layers.*``, ``encoder.final_layernorm.*``) plus ``head.*`` on the last
pipeline stage, so a pretraining checkpoint's shards load into it directly (at any layout, through
dist-checkpointing) and a fine-tuned checkpoint round-trips. The head is a plain ``nn.Module``
(:mod:`bio_megatron.models.heads`): megatron treats it as replicated across tensor-parallel ranks (identical
inputs, identical grads, counted once in the gradient norm).

It lives with the families rather than in ``models/`` because the family registry builds its encoder
(``Family.task_encoder``); filling it from a checkpoint or an HF folder is :mod:`bio_megatron.formats.fill`.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from megatron.core import parallel_state as ps
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import family_of_model
from bio_megatron.models.attention import packed_attention_mask, packed_position_ids, unpack_rows
from bio_megatron.models.bert import transformer_config
from bio_megatron.models.heads import pytorch_default_init
from bio_megatron.models.init import init_weights, on_device


class TaskModel(MegatronModule):
    """This rank's stage of the family's encoder (``Family.task_encoder``) + head; returns hidden states between stages, head logits at the end."""

    def __init__(self, m: ModelConfig, padded_vocab: int, head: nn.Module | None, dtype: torch.dtype,
                 pre_process: bool, post_process: bool):
        super().__init__(config=transformer_config(m, dtype))
        self.pre_process, self.post_process = pre_process, post_process
        self.model_type = ModelType.encoder_or_decoder  # what megatron's schedules expect of BERT
        self.shape, self.padded_vocab = m.shape(), padded_vocab
        self.share_embeddings_and_output_weights = False  # no LM output layer: nothing tied across stages
        self.family = family_of_model(m)
        embedding, self.encoder = self.family.task_encoder(m, padded_vocab, self.config, pre_process, post_process)
        if embedding is not None:  # the first pipeline stage only
            self.embedding = embedding
        # megatron's unfused attention wants [b,1,s,s]; SDPA/Transformer Engine a key-padding mask [b,1,1,s].
        unfused = any(type(mod) is DotProductAttention for mod in self.encoder.modules())
        self.mask_dims = "b1ss" if unfused else "b11s"
        if post_process:
            self.head = head

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self.encoder.set_input_tensor(input_tensor)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                tokentype_ids: torch.Tensor | None = None, unpack: torch.Tensor | None = None) -> torch.Tensor:
        """``unpack`` (packed fine-tuning batches, ``tasks/packing.py``): ``attention_mask`` numbers the examples of
        each row 1, 2, ...; they attend only to themselves, positions restart, and the head sees each example's
        states laid out as if unpacked (``[n_examples, L, h]``: its [CLS] at 0)."""
        if unpack is not None:
            mask = packed_attention_mask(attention_mask)
            positions = packed_position_ids(attention_mask)
        else:
            mask = attention_mask.unsqueeze(1)
            mask = (mask.unsqueeze(2) * mask.unsqueeze(3)) if self.mask_dims == "b1ss" else mask.unsqueeze(1)
            mask = mask < 0.5
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        hidden = None
        if self.pre_process:
            hidden = self.embedding(input_ids=input_ids, position_ids=positions, tokentype_ids=tokentype_ids)
        hidden = self.encoder(hidden_states=hidden, attention_mask=mask)
        if not self.post_process:
            return hidden
        hidden = hidden.transpose(0, 1)  # [s, b, h] -> [b, s, h]
        hidden = unpack_rows(hidden, unpack) if unpack is not None else hidden
        if getattr(self.head, "reads_padding_mask", False):  # a mean over real tokens (ModernBERT's mean pooling)
            return self.head(hidden, (unpack >= 0) if unpack is not None else attention_mask > 0)
        return self.head(hidden)


def build_task_model(m: ModelConfig, padded_vocab: int, head: nn.Module, dtype: torch.dtype, seed: int,
                     pre_process: bool | None = None, post_process: bool | None = None,
                     initialise: bool = True) -> TaskModel:
    """This rank's stage, weights initialised layout-invariantly (encoder and head). ``initialise=False``: left
    uninitialised for a caller that fills them from a checkpoint and then calls :func:`init_task_model` for the
    rest (drawing every weight first cost seconds at 345m, all overwritten)."""
    pre = ps.is_pipeline_first_stage() if pre_process is None else pre_process
    post = ps.is_pipeline_last_stage() if post_process is None else post_process
    model = on_device(TaskModel(m, padded_vocab, head if post else None, dtype, pre, post), dtype)
    if initialise:
        init_task_model(model, m, seed)
    return model


def init_task_model(model: TaskModel, m: ModelConfig, seed: int, skip: Collection[str] = frozenset()) -> None:
    """The initial value of every weight whose global key is not in ``skip``: the values a fresh model has, key by
    key, so filling some from a checkpoint first and initialising the rest equals initialising all, then filling."""
    init_weights(model, seed, m.init_method_std, m.shape().num_layers, skip)
    head = getattr(model, "head", None)
    if head is not None and not getattr(head, "use_transformer_init", True):
        pytorch_default_init(head, "head.", seed, skip)
