"""ALBERT (Lan et al. 2020; BioM-ALBERT-xxlarge, BioM-Transformers §3.1): factorised embedding, one post-LN layer
shared by all ``num_layers`` applications, ``gelu_new``, sentence-order prediction; Hugging Face ``Albert*``
(``model_type: albert``). The model is :mod:`bio_megatron.models.albert`.

Tensor names, ours (TP1, :class:`~bio_megatron.models.albert.AlbertModel`) -> HF (``AlbertForPreTraining``)::

    embedding.word_embeddings / position_embeddings / tokentype_embeddings -> albert.embeddings.*_embeddings
    embedding.layernorm                          -> albert.embeddings.LayerNorm
    encoder.embedding_projection                 -> albert.encoder.embedding_hidden_mapping_in
    encoder.layer.self_attention.linear_qkv      -> albert.encoder.albert_layer_groups.0.albert_layers.0.attention.
                                                    {query,key,value} (megatron-core groups the fused rows per head:
                                                    [q_h0, k_h0, v_h0, q_h1, ...])
    encoder.layer.self_attention.linear_proj     -> ...attention.dense
    encoder.layer.post_attention_layernorm       -> ...attention.LayerNorm
    encoder.layer.mlp.linear_fc1 / linear_fc2    -> ...ffn / ...ffn_output
    encoder.layer.post_mlp_layernorm             -> ...full_layer_layer_norm
    lm_head.dense / lm_head.layer_norm           -> predictions.dense / predictions.LayerNorm
    output_layer.bias                            -> predictions.bias (= predictions.decoder.bias; decoder.weight is
                                                    the word embeddings, tied)
    pooler.dense, binary_head                    -> albert.pooler, sop_classifier.classifier

HF's ``num_hidden_groups`` / ``inner_group_num`` other than 1 (several distinct layers, layers inside a group) are
refused: every published ALBERT uses 1 and 1, and the engine holds exactly one shared layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bio_megatron.families.base import COMMON_SHAPE_KEYS, HFTask, save_tokenizer_files
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch import nn

    from bio_megatron.config.pretrain import ModelConfig

_TASK_CLASS = {"ner": "AlbertForTokenClassification", "qa": "AlbertForQuestionAnswering",
               "re": "AlbertForSequenceClassification", "classify": "AlbertForSequenceClassification"}
_LAYER = "albert.encoder.albert_layer_groups.0.albert_layers.0."
# (ours, HF's) without .weight/.bias, the layer's dense parts and LayerNorms (attention's q/k/v: fused rows).
_PAIRS = (("embedding.layernorm", "albert.embeddings.LayerNorm"),
          ("encoder.embedding_projection", "albert.encoder.embedding_hidden_mapping_in"),
          ("encoder.layer.self_attention.linear_proj", _LAYER + "attention.dense"),
          ("encoder.layer.post_attention_layernorm", _LAYER + "attention.LayerNorm"),
          ("encoder.layer.mlp.linear_fc1", _LAYER + "ffn"),
          ("encoder.layer.mlp.linear_fc2", _LAYER + "ffn_output"),
          ("encoder.layer.post_mlp_layernorm", _LAYER + "full_layer_layer_norm"))
_TABLES = (("embedding.position_embeddings.weight", "albert.embeddings.position_embeddings.weight"),
           ("embedding.tokentype_embeddings.weight", "albert.embeddings.token_type_embeddings.weight"))
_LM_HEAD = (("lm_head.dense", "predictions.dense"), ("lm_head.layer_norm", "predictions.LayerNorm"))
_SOP = (("pooler.dense", "albert.pooler"), ("binary_head", "sop_classifier.classifier"))
# HF activation names computing GELU's tanh approximation (gelu_new) or exact GELU.
_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu"}
# Fine-tuning heads in the plain Albert*For classes: HF name -> ours (a single Linear, or RE's tanh pooler + Linear).
HEAD_PAIRS = {"ner": {"classifier": "head.mlp.layer0"}, "qa": {"qa_outputs": "head.mlp.layer0"},
              "re": {"albert.pooler": "head.mlp.layer0", "classifier": "head.mlp.layer2"},
              "classify": {"albert.pooler": "head.mlp.layer0", "classifier": "head.mlp.layer2"}}


def _wb(pairs, src: dict, ours_to_theirs: bool) -> dict:
    out = {}
    for ours, theirs in pairs:
        for p in ("weight", "bias"):
            a, b = (f"{ours}.{p}", f"{theirs}.{p}") if ours_to_theirs else (f"{theirs}.{p}", f"{ours}.{p}")
            out[b] = src[a]
    return out


class AlbertFamily:
    """The ALBERT family object (:class:`~bio_megatron.families.base.Family`)."""

    name = "albert"
    hf_model_types = ("albert",)
    tokenizer_kind = "sentencepiece"  # ALBERT's own; a WordPiece vocab.txt works as for any family
    block_type = "post_ln"
    shape_keys = COMMON_SHAPE_KEYS + ("embedding_size", "hidden_act")  # the factorised width, gelu_new

    def __repr__(self) -> str:
        return "<family albert>"

    def save_tokenizer(self, out: Path, vocab_file: Path, lowercase: bool | None) -> None:
        """spiece.model and AlbertTokenizer's files; an ALBERT over a WordPiece vocab.txt writes BertTokenizer's."""
        save_tokenizer_files(out, vocab_file, lowercase)

    def parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """One shared layer, the factorised embedding, the tied E-wide output (``models.albert``)."""
        from bio_megatron.models.albert import albert_parameter_count

        return albert_parameter_count(m, padded_vocab)

    def encoder_parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """:meth:`parameter_count` without the MLM head and the sentence-order head (``models.albert``)."""
        from bio_megatron.models.albert import albert_encoder_parameter_count

        return albert_encoder_parameter_count(m, padded_vocab)

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        if task is None:
            return "AlbertForPreTraining" if binary_head else "AlbertForMaskedLM"
        return _TASK_CLASS[task]

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        problems = []
        for key in ("num_hidden_groups", "inner_group_num"):
            if cfg.get(key, 1) != 1:
                problems.append(f"{key} {cfg[key]!r} (the engine shares one layer across all layers: only 1)")
        act = cfg.get("hidden_act", "gelu_new")
        if act not in _ACTIVATIONS:
            problems.append(f"hidden_act {act!r} (only gelu_new or gelu)")
        pos = cfg.get("position_embedding_type", "absolute")
        if pos != "absolute":
            problems.append(f"position_embedding_type {pos!r} (only 'absolute')")
        if cfg.get("hidden_size", 0) % max(cfg.get("num_attention_heads", 1), 1):
            problems.append(f"hidden_size ({cfg.get('hidden_size')}) not divisible by num_attention_heads "
                            f"({cfg.get('num_attention_heads')})")
        if cfg.get("tie_word_embeddings") is False:
            problems.append("tie_word_embeddings false (the engine ties the MLM decoder to the word embeddings)")
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        return {"num_layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"],
                "num_attention_heads": cfg["num_attention_heads"], "ffn_hidden_size": cfg["intermediate_size"],
                "max_position_embeddings": cfg["max_position_embeddings"], "num_tokentypes": cfg["type_vocab_size"],
                "layernorm_epsilon": cfg.get("layer_norm_eps", 1e-12), "transformer_block_type": "post_ln",
                "family": "albert", "embedding_size": cfg.get("embedding_size", 128), "hidden_act": _ACTIVATIONS[act]}

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        from transformers import AlbertConfig

        s = m.shape()
        fields = dict(vocab_size=vocab_size, embedding_size=m.embedding_size or s.hidden_size,
                      hidden_size=s.hidden_size, num_hidden_layers=s.num_layers, num_hidden_groups=1, inner_group_num=1,
                      num_attention_heads=s.num_attention_heads, intermediate_size=s.ffn_hidden_size,
                      hidden_act=m.hidden_act or "gelu_new", hidden_dropout_prob=m.hidden_dropout,
                      attention_probs_dropout_prob=m.attention_dropout,
                      max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.num_tokentypes,
                      initializer_range=m.init_method_std, layer_norm_eps=m.layernorm_epsilon, tie_word_embeddings=True)
        return AlbertConfig(**{**fields, **extra})

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        """AlbertConfig's special-token ids from our tokenizer (ALBERT's bos/eos are [CLS]/[SEP]); nothing in the
        tensor map depends on them."""
        ids = {"pad_token_id": "pad", "bos_token_id": "cls", "eos_token_id": "sep"}
        return {k: int(getattr(tokenizer, a)) for k, a in ids.items() if isinstance(getattr(tokenizer, a, None), int)}

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        problems = []
        if m.transformer_block_type != "post_ln":
            problems.append(f"transformer_block_type {m.transformer_block_type} (ALBERT's layer is post-LN)")
        return problems

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *,
              binary_head: bool, **tokens) -> dict[str, torch.Tensor]:
        s = m.shape()
        word = sd["embedding.word_embeddings.weight"][:vocab_size]
        out = {"albert.embeddings.word_embeddings.weight": word, **{t: sd[o] for o, t in _TABLES},
               **_wb(_PAIRS, sd, True)}
        out.update(_split_qkv(sd["encoder.layer.self_attention.linear_qkv.weight"],
                              sd["encoder.layer.self_attention.linear_qkv.bias"], s.num_attention_heads))
        if "lm_head.dense.weight" in sd:
            bias = sd["output_layer.bias"][:vocab_size]
            out.update({**_wb(_LM_HEAD, sd, True), "predictions.bias": bias, "predictions.decoder.bias": bias,
                        "predictions.decoder.weight": word})
        if binary_head:
            out.update(_wb(_SOP, sd, True))
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        import torch

        if not any(k.startswith("albert.") for k in hsd):  # a bare AlbertModel saves its weights without the prefix
            hsd = {f"albert.{k}" if not k.startswith(("predictions.", "sop_classifier.")) else k: v
                   for k, v in hsd.items()}

        def pad(t: torch.Tensor) -> torch.Tensor:
            extra = padded_vocab - t.shape[0]
            return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))]) if extra > 0 else t

        word = hsd["albert.embeddings.word_embeddings.weight"]
        out = {"embedding.word_embeddings.weight": pad(word), **{o: hsd[t] for o, t in _TABLES},
               **_wb(_PAIRS, hsd, False)}
        out.update(_fuse_qkv(hsd, m.shape().num_attention_heads))
        decoder = hsd.get("predictions.decoder.weight")
        if decoder is not None and not torch.equal(decoder, word):
            raise CheckpointError("predictions.decoder.weight differs from the word embeddings (untied output "
                                  "embeddings): not supported, the engine ties them")
        if "predictions.dense.weight" in hsd:
            out.update(_wb(_LM_HEAD, hsd, False))
            out["output_layer.bias"] = pad(hsd.get("predictions.bias", hsd.get("predictions.decoder.bias")))
        if binary_head or "sop_classifier.classifier.weight" in hsd:  # the SOP head, wherever the folder has one
            out.update(_wb(_SOP, hsd, False))
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        from bio_megatron.models.albert import build_albert_model

        return build_albert_model(m, vocab_size, dtype)

    def task_encoder(self, m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                     post_process: bool) -> tuple[nn.Module | None, nn.Module]:
        from bio_megatron.models.albert import albert_task_encoder

        return albert_task_encoder(m, padded_vocab, config.params_dtype, pre_process, post_process)

    def head_to_hf(self, task: str, sd: dict) -> dict:
        """A fine-tuned model's ``head.*`` under the plain ``Albert*For`` class's names."""
        return {f"{theirs}.{p}": sd[f"{ours}.{p}"].detach().clone().contiguous()
                for theirs, ours in HEAD_PAIRS[task].items() for p in ("weight", "bias")}

    def head_from_hf(self, task: str, hsd: dict) -> dict:
        """The inverse of :meth:`head_to_hf` (KeyError names a missing weight)."""
        return {f"{ours}.{p}": hsd[f"{theirs}.{p}"] for theirs, ours in HEAD_PAIRS[task].items()
                for p in ("weight", "bias")}


def _split_qkv(w, b, heads: int) -> dict:
    """megatron-core's fused QKV (rows grouped per head) -> HF's query / key / value."""
    h = w.shape[1]
    d = h // heads
    w, b = w.view(heads, 3, d, h), b.view(heads, 3, d)
    out = {}
    for j, name in enumerate(("query", "key", "value")):
        out[f"{_LAYER}attention.{name}.weight"] = w[:, j].reshape(h, h)
        out[f"{_LAYER}attention.{name}.bias"] = b[:, j].reshape(h)
    return out


def _fuse_qkv(hsd: dict, heads: int) -> dict:
    import torch

    names = ("query", "key", "value")
    q = hsd[f"{_LAYER}attention.query.weight"]
    h = q.shape[1]
    d = h // heads
    w = torch.stack([hsd[f"{_LAYER}attention.{n}.weight"].view(heads, d, h) for n in names], dim=1)
    b = torch.stack([hsd[f"{_LAYER}attention.{n}.bias"].view(heads, d) for n in names], dim=1)
    return {"encoder.layer.self_attention.linear_qkv.weight": w.reshape(3 * h, h),
            "encoder.layer.self_attention.linear_qkv.bias": b.reshape(3 * h)}


ALBERT = AlbertFamily()
