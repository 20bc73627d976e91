"""Megatron BERT (megatron-core, TP1 full state) <-> Hugging Face ``MegatronBert*`` state dicts.

Pitfalls handled here (converters written by others degraded models through them):
- megatron-core's fused ``linear_qkv`` rows are grouped per head ``[q_h0, k_h0, v_h0, q_h1, ...]``;
  a naive ``chunk(3)`` is wrong.
- the vocabulary is padded to a multiple of 128 x TP in Megatron; HF holds only the real entries.
- GELU is exact (erf) on both sides; LayerNorm eps 1e-12.
"""

from __future__ import annotations

import torch

from bio_megatron.config.sizes import ModelShape

_LAYER_PAIRS = {
    "input_layernorm": "attention.ln", "self_attention.linear_proj": "attention.output.dense",
    "pre_mlp_layernorm": "ln", "mlp.linear_fc1": "intermediate.dense", "mlp.linear_fc2": "output.dense",
}
# megatron-core's local spec stores LayerNorms under these names (TE's spec fuses them into the linears).
_TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def hf_config(shape: ModelShape, vocab_size: int, max_position_embeddings: int, num_tokentypes: int = 2,
              layernorm_epsilon: float = 1e-12, **extra):
    from transformers import MegatronBertConfig

    fields = dict(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        max_position_embeddings=max_position_embeddings, type_vocab_size=num_tokentypes,
        layer_norm_eps=layernorm_epsilon, tie_word_embeddings=True)
    return MegatronBertConfig(**{**fields, **extra})


def _normalise(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        if not torch.is_tensor(v) or k.endswith("_extra_state"):
            continue
        for te_name, local_name in _TE_ALIASES.items():
            if k.endswith(te_name):
                k = k[: -len(te_name)] + local_name
        out[k] = v
    return out


def mcore_to_hf(sd: dict[str, torch.Tensor], shape: ModelShape, vocab_size: int, *, binary_head: bool,
                prefix: str = "bert.") -> dict[str, torch.Tensor]:
    """Full (TP1) megatron-core BertModel state -> HF ``MegatronBertFor{PreTraining,MaskedLM}`` state.

    ``prefix`` is where HF keeps the encoder (``bert.``); MLM head keys go under ``cls.predictions``.
    """
    sd = _normalise(sd)
    h, heads, d = shape.hidden_size, shape.num_attention_heads, shape.hidden_size // shape.num_attention_heads
    word = sd["embedding.word_embeddings.weight"][:vocab_size]
    out = {
        f"{prefix}embeddings.word_embeddings.weight": word,
        f"{prefix}embeddings.position_embeddings.weight": sd["embedding.position_embeddings.weight"],
        f"{prefix}embeddings.token_type_embeddings.weight": sd["embedding.tokentype_embeddings.weight"],
        f"{prefix}encoder.ln.weight": sd["encoder.final_layernorm.weight"],
        f"{prefix}encoder.ln.bias": sd["encoder.final_layernorm.bias"],
    }
    if "lm_head.dense.weight" in sd:
        out.update({
            "cls.predictions.transform.dense.weight": sd["lm_head.dense.weight"],
            "cls.predictions.transform.dense.bias": sd["lm_head.dense.bias"],
            "cls.predictions.transform.LayerNorm.weight": sd["lm_head.layer_norm.weight"],
            "cls.predictions.transform.LayerNorm.bias": sd["lm_head.layer_norm.bias"],
            "cls.predictions.bias": sd["output_layer.bias"][:vocab_size],
            "cls.predictions.decoder.weight": word,
            "cls.predictions.decoder.bias": sd["output_layer.bias"][:vocab_size],
        })
    if binary_head:
        out.update({
            f"{prefix}pooler.dense.weight": sd["pooler.dense.weight"], f"{prefix}pooler.dense.bias": sd["pooler.dense.bias"],
            "cls.seq_relationship.weight": sd["binary_head.weight"], "cls.seq_relationship.bias": sd["binary_head.bias"],
        })
    for i in range(shape.num_layers):
        m, hf = f"encoder.layers.{i}.", f"{prefix}encoder.layer.{i}."
        w = sd[m + "self_attention.linear_qkv.weight"].view(heads, 3, d, h)
        b = sd[m + "self_attention.linear_qkv.bias"].view(heads, 3, d)
        for j, name in enumerate(("query", "key", "value")):
            out[hf + f"attention.self.{name}.weight"] = w[:, j].reshape(h, h)
            out[hf + f"attention.self.{name}.bias"] = b[:, j].reshape(h)
        for a, c in _LAYER_PAIRS.items():
            out[hf + c + ".weight"] = sd[m + a + ".weight"]
            out[hf + c + ".bias"] = sd[m + a + ".bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def hf_to_mcore(hsd: dict[str, torch.Tensor], shape: ModelShape, padded_vocab_size: int, *,
                binary_head: bool, prefix: str = "bert.") -> dict[str, torch.Tensor]:
    """HF ``MegatronBert*`` state -> full (TP1) megatron-core BertModel state, vocabulary zero-padded."""
    h, heads, d = shape.hidden_size, shape.num_attention_heads, shape.hidden_size // shape.num_attention_heads

    def pad(t: torch.Tensor) -> torch.Tensor:
        extra = padded_vocab_size - t.shape[0]
        return torch.cat([t, t.new_zeros((extra,) + tuple(t.shape[1:]))]) if extra > 0 else t

    out = {
        "embedding.word_embeddings.weight": pad(hsd[f"{prefix}embeddings.word_embeddings.weight"]),
        "embedding.position_embeddings.weight": hsd[f"{prefix}embeddings.position_embeddings.weight"],
        "embedding.tokentype_embeddings.weight": hsd[f"{prefix}embeddings.token_type_embeddings.weight"],
        "encoder.final_layernorm.weight": hsd[f"{prefix}encoder.ln.weight"],
        "encoder.final_layernorm.bias": hsd[f"{prefix}encoder.ln.bias"],
    }
    if "cls.predictions.transform.dense.weight" in hsd:
        out.update({
            "lm_head.dense.weight": hsd["cls.predictions.transform.dense.weight"],
            "lm_head.dense.bias": hsd["cls.predictions.transform.dense.bias"],
            "lm_head.layer_norm.weight": hsd["cls.predictions.transform.LayerNorm.weight"],
            "lm_head.layer_norm.bias": hsd["cls.predictions.transform.LayerNorm.bias"],
            "output_layer.bias": pad(hsd.get("cls.predictions.bias", hsd.get("cls.predictions.decoder.bias"))),
        })
    if binary_head:
        out.update({"pooler.dense.weight": hsd[f"{prefix}pooler.dense.weight"],
                    "pooler.dense.bias": hsd[f"{prefix}pooler.dense.bias"],
                    "binary_head.weight": hsd["cls.seq_relationship.weight"],
                    "binary_head.bias": hsd["cls.seq_relationship.bias"]})
    for i in range(shape.num_layers):
        m, hf = f"encoder.layers.{i}.", f"{prefix}encoder.layer.{i}."
        qkv_w = torch.stack([hsd[hf + f"attention.self.{n}.weight"].view(heads, d, h)
                             for n in ("query", "key", "value")], dim=1)
        qkv_b = torch.stack([hsd[hf + f"attention.self.{n}.bias"].view(heads, d) for n in ("query", "key", "value")],
                            dim=1)
        out[m + "self_attention.linear_qkv.weight"] = qkv_w.reshape(3 * h, h)
        out[m + "self_attention.linear_qkv.bias"] = qkv_b.reshape(3 * h)
        for a, c in _LAYER_PAIRS.items():
            out[m + a + ".weight"] = hsd[hf + c + ".weight"]
            out[m + a + ".bias"] = hsd[hf + c + ".bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}
