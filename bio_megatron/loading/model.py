"""Encoder + task head on megatron-core, at any TP/PP layout, and every way to fill its weights.

:class:`TaskModel` holds exactly the parameter names of megatron-core's ``BertModel`` encoder
(``embedding.*``, ``encoder.layers.*``, ``encoder.final_layernorm.*``) plus ``head.*`` on the last
pipeline stage, so a pretraining checkpoint's shards load into it directly (at any layout, through
dist-checkpointing) and a fine-tuned checkpoint round-trips. The head is a plain ``nn.Module``
(:mod:`bio_megatron.models.heads`): megatron treats it as replicated across tensor-parallel ranks (identical
inputs, identical grads, counted once in the gradient norm).

:func:`load_into` fills it from a :class:`~bio_megatron.formats.source.Source`: our checkpoints through
dist-checkpointing (any saved layout), Hugging Face folders through :func:`load_full_state`.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.families import family_of_model
from bio_megatron.formats.hf.read import read_hf_state
from bio_megatron.formats.source import Source
from bio_megatron.models.attention import packed_attention_mask, packed_position_ids, unpack_rows
from bio_megatron.models.bert import transformer_config
from bio_megatron.models.heads import pytorch_default_init
from bio_megatron.models.hf_convert import TE_ALIASES
from bio_megatron.models.init import init_weights, on_device
from bio_megatron.training import integrity
from bio_megatron.training.checkpoint import from_main_params, load_sharded, verify
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


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


def task_padded_vocab(m: ModelConfig, vocab_size: int, src: Source | None) -> int:
    """Keep the checkpoint's padded vocabulary when this TP size divides it (dist-checkpointing then loads
    the embedding shards unchanged); otherwise Megatron's rule (multiple of 128 x TP)."""
    tp = m.tensor_model_parallel_size
    if src is not None and src.padded_vocab and src.padded_vocab % tp == 0 and src.padded_vocab >= vocab_size:
        return int(src.padded_vocab)
    return padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp)


def build_task_model(m: ModelConfig, padded_vocab: int, head: nn.Module, dtype: torch.dtype, seed: int,
                     pre_process: bool | None = None, post_process: bool | None = None) -> TaskModel:
    """This rank's stage, weights initialised layout-invariantly (encoder and head)."""
    pre = ps.is_pipeline_first_stage() if pre_process is None else pre_process
    post = ps.is_pipeline_last_stage() if post_process is None else post_process
    model = TaskModel(m, padded_vocab, head if post else None, dtype, pre, post)
    init_weights(model, seed, m.init_method_std, m.shape().num_layers)
    if post and not getattr(head, "use_transformer_init", True):
        pytorch_default_init(model.head, "head.", seed)
    return on_device(model, dtype)


def load_into(model: nn.Module, src: Source, encoder_only: bool) -> None:
    """Fill ``model`` from ``src``. ``encoder_only`` (a pretraining model, or another task's checkpoint): the head
    keeps its initialisation, except the tensors its family takes from a pretraining head that ``src`` holds
    (``Family.task_head_from_pretraining``: ModernBERT's dense and norm, as transformers' ``from_pretrained``)."""
    inherit = dict(model.family.task_head_from_pretraining) if encoder_only else {}
    if src.kind == "hf":
        full = read_hf_state(src.path, model.shape, model.padded_vocab)
        load_full_state(model, full, skip_prefix="head." if encoder_only else None)
        taken = []
        for _, sh in _glu_halves(model.sharded_state_dict()):  # the last stage's head, at any TP layout
            if isinstance(sh, ShardedTensor) and inherit.get(sh.key) in full:
                with torch.no_grad():
                    sh.data.copy_(full[inherit[sh.key]][sh.global_slice()].reshape(sh.local_shape).to(sh.data.dtype))
                taken.append(inherit[sh.key])
        _log_taken(src, taken)
        return
    sharded = model.sharded_state_dict()
    wanted = {k: v for k, v in sharded.items() if not (encoder_only and k.startswith("head."))}
    heads = {k: v for k, v in sharded.items() if isinstance(v, ShardedTensor) and v.key in inherit}
    if heads:  # this stage holds the head: its inherited tensors are read under the pretraining head's keys
        saved = _saved_keys(src.path)
        wanted.update({k: dataclasses.replace(v, key=inherit[v.key]) for k, v in heads.items()
                       if inherit[v.key] in saved})
        _log_taken(src, [inherit[v.key] for v in heads.values() if inherit[v.key] in saved])
    from_main_params(wanted, src.path)  # an fp32 model from a bf16/fp16 run takes its fp32 main parameters
    state = load_sharded(src.path, {"model": wanted})["model"]  # verified, pickle allow-lists, one-line errors
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (encoder_only and k.startswith("head.")) and not k.endswith("_extra_state")]
    if missing or unexpected:
        raise CheckpointError(f"{src.path}: weights do not match the model (missing {missing[:5]}, "
                              f"unexpected {list(unexpected)[:5]})")


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


def _glu_halves(sharded: dict):
    """(name, entry) of a sharded state dict, a gated MLP's fc1 (megatron's ShardedTensorFactory, ModernBERT's
    GeGLU) as its two halves, each a view of the parameter under its own global key."""
    for key, sh in sharded.items():
        if isinstance(sh, ShardedTensorFactory):
            yield from ((key, part) for part in sh.build() if isinstance(part, ShardedTensor))
        else:
            yield key, sh


@torch.no_grad()
def load_full_state(model: nn.Module, full: dict[str, torch.Tensor], skip_prefix: str | None = None) -> None:
    """Copy an unsharded (TP1, per-layer) state dict into this rank's shards, using the same global
    key/slice bookkeeping as the layout-invariant init: works at any TP/PP layout."""
    for key, sh in _glu_halves(model.sharded_state_dict()):
        if not isinstance(sh, ShardedTensor) or (skip_prefix and key.startswith(skip_prefix)):
            continue
        if sh.key in full:
            value = full[sh.key]
        elif sh.key.startswith("encoder.layers."):
            rest = sh.key[len("encoder.layers."):]
            # a gated MLP's fc1 halves ([x; gate] rows): <name>_w is the first, <name>_v the second
            half = "_wv".index(rest[-1]) - 1 if rest.endswith(("weight_w", "weight_v")) else None
            rest = rest[:-2] if half is not None else rest
            # the local spec checkpoints its LayerNorms under Transformer Engine's fused names
            rest = TE_ALIASES.get(rest, rest) if f"encoder.layers.0.{rest}" not in full else rest
            layers = [full[f"encoder.layers.{i}.{rest}"] for i in range(sh.global_shape[0])]
            value = torch.stack(layers if half is None else [t.chunk(2)[half] for t in layers])
        else:
            raise CheckpointError(f"weight {sh.key} is missing from the source")
        if tuple(value.shape) != tuple(sh.global_shape):  # vocabulary padding differs: zero-pad the rows
            if value.shape[1:] != tuple(sh.global_shape[1:]) or value.shape[0] > sh.global_shape[0]:
                raise CheckpointError(f"weight {sh.key} has shape {tuple(value.shape)} in the source but "
                                      f"{tuple(sh.global_shape)} in this model (different head or model size?)")
            pad = torch.zeros(sh.global_shape, dtype=value.dtype)
            pad[: value.shape[0]] = value
            value = pad
        sh.data.copy_(value[sh.global_slice()].reshape(sh.local_shape).to(sh.data.dtype))
