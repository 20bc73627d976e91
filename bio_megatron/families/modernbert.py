"""ModernBERT (Warner et al. 2024; BioClinical ModernBERT, 2025): rotary positions with a global and a local base,
local (sliding-window) attention on all but every N-th layer, GeGLU, bias-free linears and LayerNorms; Hugging Face
``ModernBert*`` (``model_type: modernbert``). The model is :mod:`bio_megatron.models.modernbert`.

Tensor names, ours (TP1, :class:`~bio_megatron.models.modernbert.ModernBertModel`) -> HF (``ModernBertForMaskedLM``;
a bare ``ModernBertModel`` saves the encoder without ``model.``)::

    embedding.word_embeddings / embedding.norm      -> model.embeddings.tok_embeddings / model.embeddings.norm
    encoder.layers.{i}.input_layernorm (i > 0)      -> model.layers.{i}.attn_norm (layer 0 applies none)
    encoder.layers.{i}.self_attention.linear_qkv    -> model.layers.{i}.attn.Wqkv (HF's rows are [q; k; v], each
                                                       head-major; megatron groups them per head: [q_h0, k_h0, v_h0, ...])
    encoder.layers.{i}.self_attention.linear_proj   -> model.layers.{i}.attn.Wo
    encoder.layers.{i}.pre_mlp_layernorm            -> model.layers.{i}.mlp_norm
    encoder.layers.{i}.mlp.linear_fc1 / linear_fc2  -> model.layers.{i}.mlp.Wi ([input; gate], megatron's GLU order)
                                                       / model.layers.{i}.mlp.Wo
    encoder.final_layernorm                         -> model.final_norm
    lm_head.dense / lm_head.norm                    -> head.dense / head.norm
    output_layer.bias                               -> decoder.bias (decoder.weight: the word embeddings, tied)

An HF config the engine cannot compute exactly is refused by name (one line, exit 2 at import): biases on
(``attention_bias``, ``mlp_bias``, ``norm_bias``, ``classifier_bias``), no decoder bias, untied decoder, another
activation, a RoPE type other than ``default``, a ``head_dim`` other than hidden/heads, or an attention pattern
other than "global on layers 0, N, 2N, ..." (``layer_types``).

Task classes (``ModernBertFor{Token,Sequence}Classification``, ``ModernBertForQuestionAnswering``): a ModernBERT
model's task head is always theirs (:class:`~bio_megatron.models.modernbert.ModernBertTaskHead`: prediction head
dense-GELU-norm, dropout, classifier; ``models.heads.build_head`` picks it for the family), so every fine-tuned
ModernBERT exports to the plain class and every such folder imports::

    head.dense / head.norm / head.classifier        -> head.dense / head.norm / classifier

``finetune`` from a pretraining model (our checkpoint, an HF ``ModernBertForMaskedLM``) starts the task head's dense
and norm from the MLM head's and only the classifier fresh, as transformers' ``from_pretrained`` of such a folder
(:attr:`ModernBertFamily.task_head_from_pretraining`).

HF's ``classifier_dropout`` is the head's dropout: the task block's ``fc_dropout`` at import
(:meth:`ModernBertFamily.hf_head_settings`) and back at export (:meth:`ModernBertFamily.hf_config`).
Sequence classification pools the [CLS] position (``classifier_pooling: cls``) or averages the real tokens
(``mean``): ``model.classifier_head.pooling`` both ways (``families.task.TaskModel`` hands that head the padding mask).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bio_megatron.families.base import HFTask
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch import nn

    from bio_megatron.config.pretrain import ModelConfig

_TASK_CLASS = {"ner": "ModernBertForTokenClassification", "qa": "ModernBertForQuestionAnswering",
               "re": "ModernBertForSequenceClassification", "classify": "ModernBertForSequenceClassification"}
# (ours, HF's) per layer, weights only (every linear and LayerNorm is bias-free)
_LAYER = (("self_attention.linear_proj", "attn.Wo"), ("pre_mlp_layernorm", "mlp_norm"),
          ("mlp.linear_fc1", "mlp.Wi"), ("mlp.linear_fc2", "mlp.Wo"))
_TOP = (("embedding.word_embeddings", "model.embeddings.tok_embeddings"), ("embedding.norm", "model.embeddings.norm"),
        ("encoder.final_layernorm", "model.final_norm"))
_HEAD = (("lm_head.dense", "head.dense"), ("lm_head.norm", "head.norm"))
# a task head (ours -> HF's): the prediction head keeps its names, the classifier leaves ``head.``
_TASK_HEAD = (("head.dense.weight", "head.dense.weight"), ("head.norm.weight", "head.norm.weight"),
              ("head.classifier.weight", "classifier.weight"), ("head.classifier.bias", "classifier.bias"))
_POOLED = ("ModernBertForSequenceClassification", "ModernBertForMultipleChoice")
# HF keys that must hold these values for the engine to compute the model exactly
_FIXED = {"hidden_activation": "gelu", "classifier_activation": "gelu", "norm_bias": False, "attention_bias": False,
          "mlp_bias": False, "classifier_bias": False, "decoder_bias": True, "tie_word_embeddings": True}


def _pattern(cfg: dict) -> int | str:
    """N of "global on layers 0, N, 2N, ...", from ``layer_types`` (transformers 5) or
    ``global_attn_every_n_layers`` (earlier configs); a description of the pattern when it is not one."""
    layers = cfg.get("num_hidden_layers", 1)
    types = cfg.get("layer_types")
    if types is None:
        return int(cfg.get("global_attn_every_n_layers", 3))
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every = full[1] if len(full) > 1 else max(layers, 1)
    want = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
    return every if list(types) == want else f"global layers {full}"


def _theta(cfg: dict, kind: str, legacy: str, default: float) -> float | str:
    params = (cfg.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        return f"rope_type {params['rope_type']!r}"
    return float(params.get("rope_theta", cfg.get(legacy, default)))


class ModernBertFamily:
    """The ModernBERT family object (:class:`~bio_megatron.families.base.Family`)."""

    name = "modernbert"
    hf_model_types = ("modernbert",)
    tokenizer_kind = "bpe"  # ModernBERT's own (OLMo's BPE in tokenizer.json); a WordPiece vocab.txt works too
    block_type = "pre_ln"

    def __repr__(self) -> str:
        return "<family modernbert>"

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        return "ModernBertForMaskedLM" if task is None else _TASK_CLASS[task]

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        problems = [f"{k} {cfg[k]!r} (only {v!r})" for k, v in _FIXED.items() if k in cfg and cfg[k] != v]
        every = _pattern(cfg)
        if isinstance(every, str):
            problems.append(f"layer_types with {every} (only global attention on layers 0, N, 2N, ...)")
        thetas = {k: _theta(cfg, kind, legacy, d) for k, kind, legacy, d in (
            ("global_rope_theta", "full_attention", "global_rope_theta", 160_000.0),
            ("local_rope_theta", "sliding_attention", "local_rope_theta", 10_000.0))}
        problems += [f"rope_parameters with {v} (only 'default')" for v in thetas.values() if isinstance(v, str)]
        h, heads = cfg.get("hidden_size", 0), max(cfg.get("num_attention_heads", 1), 1)
        if h % heads:
            problems.append(f"hidden_size ({h}) not divisible by num_attention_heads ({heads})")
        if cfg.get("head_dim") not in (None, h // heads):
            problems.append(f"head_dim {cfg['head_dim']!r} (only hidden_size / num_attention_heads)")
        arch = (cfg.get("architectures") or [""])[0]
        if arch in _POOLED and cfg.get("classifier_pooling", "cls") not in ("cls", "mean"):
            problems.append(f"{arch} with classifier_pooling {cfg['classifier_pooling']!r} (only 'cls' or 'mean')")
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        return {"num_layers": cfg["num_hidden_layers"], "hidden_size": h, "num_attention_heads": heads,
                "ffn_hidden_size": cfg["intermediate_size"], "max_position_embeddings": cfg["max_position_embeddings"],
                "num_tokentypes": 0, "layernorm_epsilon": cfg.get("norm_eps", 1e-5), "transformer_block_type": "pre_ln",
                "family": "modernbert", **thetas, "local_attention": int(cfg.get("local_attention", 128)),
                "global_attn_every_n_layers": every}

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        from transformers import ModernBertConfig

        from bio_megatron.models.modernbert import setting

        s = m.shape()
        fields = dict(vocab_size=vocab_size, hidden_size=s.hidden_size, intermediate_size=s.ffn_hidden_size,
                      num_hidden_layers=s.num_layers, num_attention_heads=s.num_attention_heads,
                      max_position_embeddings=m.max_position_embeddings, norm_eps=m.layernorm_epsilon,
                      initializer_range=m.init_method_std, embedding_dropout=m.hidden_dropout,
                      mlp_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
                      local_attention=setting(m, "local_attention"),
                      global_attn_every_n_layers=setting(m, "global_attn_every_n_layers"),
                      global_rope_theta=setting(m, "global_rope_theta"),
                      local_rope_theta=setting(m, "local_rope_theta"), classifier_pooling="cls", **_FIXED)
        head = getattr(m, "classifier_head", None) or getattr(m, "head", None)
        if head is not None:  # a fine-tuned model: its classifier dropout (HF applies it before the classifier)
            fields["classifier_dropout"] = float(head.fc_dropout)
            fields["classifier_pooling"] = getattr(head, "pooling", "cls")  # a token head has none: cls, HF's default
        return ModernBertConfig(**{**fields, **extra})

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        """ModernBertConfig's special-token ids (its defaults are OLMo-vocabulary ids, past a smaller vocabulary's
        end: the embedding's padding_idx would fail); bos/eos are [CLS]/[SEP] as in ModernBERT."""
        ids = {"pad_token_id": "pad", "cls_token_id": "cls", "sep_token_id": "sep", "bos_token_id": "cls",
               "eos_token_id": "sep"}
        return {k: int(getattr(tokenizer, a)) for k, a in ids.items() if isinstance(getattr(tokenizer, a, None), int)}

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        problems = []
        if m.transformer_block_type != "pre_ln":
            problems.append(f"transformer_block_type {m.transformer_block_type} (ModernBERT's layers are pre-LN)")
        return problems

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *, binary_head: bool,
              **tokens) -> dict[str, torch.Tensor]:
        s = m.shape()
        out = {f"{theirs}.weight": sd[f"{ours}.weight"] for ours, theirs in _TOP}
        word = out["model.embeddings.tok_embeddings.weight"] = sd["embedding.word_embeddings.weight"][:vocab_size]
        for i in range(s.num_layers):
            a, b = f"encoder.layers.{i}.", f"model.layers.{i}."
            out.update({f"{b}{t}.weight": sd[f"{a}{o}.weight"] for o, t in _LAYER})
            if i:
                out[f"{b}attn_norm.weight"] = sd[f"{a}input_layernorm.weight"]
            qkv = sd[f"{a}self_attention.linear_qkv.weight"]
            h = qkv.shape[1]
            out[f"{b}attn.Wqkv.weight"] = qkv.view(s.num_attention_heads, 3, -1, h).transpose(0, 1).reshape(3 * h, h)
        if "lm_head.dense.weight" in sd:
            out.update({f"{t}.weight": sd[f"{o}.weight"] for o, t in _HEAD})
            out["decoder.bias"] = sd["output_layer.bias"][:vocab_size]
            out["decoder.weight"] = word
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        import torch

        if not any(k.startswith("model.") for k in hsd):  # a bare ModernBertModel saves its weights without it
            hsd = {f"model.{k}" if not k.startswith(("head.", "decoder.")) else k: v for k, v in hsd.items()}

        def pad(t: torch.Tensor) -> torch.Tensor:
            extra = padded_vocab - t.shape[0]
            return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))]) if extra > 0 else t

        s = m.shape()
        out = {f"{ours}.weight": hsd[f"{theirs}.weight"] for ours, theirs in _TOP}
        word = hsd["model.embeddings.tok_embeddings.weight"]
        out["embedding.word_embeddings.weight"] = pad(word)
        for i in range(s.num_layers):
            a, b = f"encoder.layers.{i}.", f"model.layers.{i}."
            out.update({f"{a}{o}.weight": hsd[f"{b}{t}.weight"] for o, t in _LAYER})
            # layer 0's is never applied (models.modernbert.UnappliedNorm): ones, as initialised
            norm = hsd[f"{b}attn_norm.weight"] if i else torch.ones_like(hsd[f"{b}mlp_norm.weight"])
            out[f"{a}input_layernorm.weight"] = norm
            qkv = hsd[f"{b}attn.Wqkv.weight"]
            h = qkv.shape[1]
            out[f"{a}self_attention.linear_qkv.weight"] = (
                qkv.view(3, s.num_attention_heads, -1, h).transpose(0, 1).reshape(3 * h, h))
        decoder = hsd.get("decoder.weight")
        if decoder is not None and not torch.equal(decoder, word):
            raise CheckpointError("decoder.weight differs from the word embeddings (untied output embeddings): not "
                                  "supported, the engine ties them")
        if "decoder.bias" in hsd:  # ModernBertForMaskedLM (a task class's ``head.*`` is its task head)
            out.update({f"{o}.weight": hsd[f"{t}.weight"] for o, t in _HEAD})
            out["output_layer.bias"] = pad(hsd["decoder.bias"])
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        from bio_megatron.models.modernbert import build_modernbert_model

        return build_modernbert_model(m, vocab_size, dtype)

    def parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """The exact parameters of :class:`~bio_megatron.models.modernbert.ModernBertModel` (``pretrain --dry-run``,
        the memory check, the benchmark report): no biases but the decoder's, no position table, GeGLU's fc1 twice
        as wide, layer 0's unapplied attention norm kept, the decoder weight tied to the word table (once)."""
        h = m.shape().hidden_size
        head = h * h + h + padded_vocab  # dense + norm, the decoder's bias
        return self.encoder_parameter_count(m, padded_vocab) + head

    def encoder_parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """The word table and its norm, the layers and the final norm (a fine-tuning model's encoder)."""
        s = m.shape()
        h, f = s.hidden_size, s.ffn_hidden_size
        per_layer = 4 * h * h + 3 * h * f + 2 * h  # qkv + proj, fc1 [2F, H] + fc2 [H, F], two LayerNorm gains
        embedding = padded_vocab * h + h  # word table + its norm
        return embedding + s.num_layers * per_layer + h  # + the final norm

    def task_encoder(self, m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                     post_process: bool) -> tuple[nn.Module | None, nn.Module]:
        from bio_megatron.models.modernbert import modernbert_task_encoder

        return modernbert_task_encoder(m, padded_vocab, config.params_dtype, pre_process, post_process)

    owns_task_heads = True
    """Every fine-tuned ModernBERT has its HF classes' head (``models.heads.build_head``): the plain class always
    computes it, whatever ``model.head`` / ``model.classifier_head`` say (only ``fc_dropout`` and ``pooling`` apply)."""

    task_head_from_pretraining = (("head.dense.weight", "lm_head.dense.weight"),
                                  ("head.norm.weight", "lm_head.norm.weight"))
    """transformers' task classes and ``ModernBertForMaskedLM`` both hold a ``ModernBertPredictionHead`` under
    ``head.``, so ``ModernBertFor<Task>.from_pretrained(<an MLM folder>)`` starts with the MLM head's dense and norm
    and only ``classifier`` fresh; a ModernBERT ``finetune`` from a pretraining model does the same (our
    ``lm_head.*`` is HF's ``head.*``: ``_HEAD``)."""

    def hf_head_settings(self, task: str, cfg: dict, head: dict) -> dict:
        """An HF task folder's head (``Source.head``) with its ``classifier_dropout`` (HF's default 0.0), the
        dropout before the classifier: ``fc_dropout`` of the task's block, and a sequence classifier's
        ``classifier_pooling`` (``pooling``); :meth:`hf_config` writes both back."""
        settings = {"fc_dropout": float(cfg.get("classifier_dropout", 0.0))}
        if task in ("re", "classify"):  # HF's classifier_pooling (shape_from_hf allowed cls or mean)
            settings["pooling"] = cfg.get("classifier_pooling", "cls")
        block = "classifier_head" if task in ("re", "classify") else "head"
        return {**head, block: {**head.get(block, {}), **settings}}

    def head_to_hf(self, task: str, sd: dict) -> dict:
        return {theirs: sd[ours].detach().clone().contiguous() for ours, theirs in _TASK_HEAD}

    def head_from_hf(self, task: str, hsd: dict) -> dict:
        return {ours: hsd[theirs].detach().clone().contiguous() for ours, theirs in _TASK_HEAD}


MODERNBERT = ModernBertFamily()
