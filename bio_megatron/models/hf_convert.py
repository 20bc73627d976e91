"""BERT layers (megatron-core, TP1 full state) <-> Hugging Face ``bert.``-named state dicts: the tensor map every
BERT-shaped family of :mod:`bio_megatron.families` shares (pre-LN ``MegatronBert*`` and post-LN ``Bert*`` names;
RoBERTa and ELECTRA rename to these first). Which family a model is, its HF model types and classes, is the
registry's business; here the layer order is read from the weights themselves (an embedding LayerNorm means
post-LN). Also: ``config.json`` vs the weights beside it, and an HF ``tokenizer.json``'s WordPiece vocabulary.

Pitfalls handled
here (converters written by others degraded models through them):
- megatron-core's fused ``linear_qkv`` rows are grouped per head ``[q_h0, k_h0, v_h0, q_h1, ...]``;
  a naive ``chunk(3)`` is wrong.
- the vocabulary is padded to a multiple of 128 x TP in Megatron; HF holds only the real entries.
- GELU is exact (erf) on both sides (megatron-core's LM head hard-codes it); LayerNorm eps from the config.
- TF-converted BERT checkpoints name LayerNorm parameters ``gamma``/``beta``.
"""

from __future__ import annotations

import re

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.utils.errors import CheckpointError

_LAYER_PAIRS = {
    "input_layernorm": "attention.ln", "self_attention.linear_proj": "attention.output.dense",
    "pre_mlp_layernorm": "ln", "mlp.linear_fc1": "intermediate.dense", "mlp.linear_fc2": "output.dense",
}
_POST_LN_LAYER_PAIRS = {
    "self_attention.linear_proj": "attention.output.dense", "post_attention_layernorm": "attention.output.LayerNorm",
    "mlp.linear_fc1": "intermediate.dense", "mlp.linear_fc2": "output.dense", "post_mlp_layernorm": "output.LayerNorm",
}
# (ours, HF's) for the weights outside the layers that only one family has.
_FAMILY_NORMS = {"pre_ln": ("encoder.final_layernorm", "encoder.ln"),
                 "post_ln": ("embedding.layernorm", "embeddings.LayerNorm")}
# megatron-core's local spec stores LayerNorms under these names (TE's spec fuses them into the linears).
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def hf_config(shape: ModelShape, vocab_size: int, max_position_embeddings: int, num_tokentypes: int = 2,
              layernorm_epsilon: float = 1e-12, block_type: str = "pre_ln", **extra):
    """``MegatronBertConfig`` (pre-LN) or ``BertConfig`` (post-LN) for this shape."""
    from transformers import BertConfig, MegatronBertConfig

    fields = dict(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        max_position_embeddings=max_position_embeddings, type_vocab_size=num_tokentypes,
        layer_norm_eps=layernorm_epsilon, tie_word_embeddings=True)
    cls = BertConfig if block_type == "post_ln" else MegatronBertConfig
    if block_type == "post_ln":
        fields["position_embedding_type"] = "absolute"
    return cls(**{**fields, **extra})


def block_type_of(sd: dict[str, torch.Tensor]) -> str:
    """``post_ln`` when the megatron-core state has BERT's embedding LayerNorm, else ``pre_ln``."""
    return "post_ln" if "embedding.layernorm.weight" in sd else "pre_ln"


def hf_block_type(hsd: dict[str, torch.Tensor], prefix: str = "bert.") -> str:
    """``post_ln`` for an HF ``Bert*`` state (embedding LayerNorm), ``pre_ln`` for ``MegatronBert*``."""
    return "post_ln" if f"{prefix}embeddings.LayerNorm.weight" in hsd else "pre_ln"


_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


def _find(hsd: dict[str, torch.Tensor], suffix: str) -> tuple[str, torch.Tensor] | None:
    """The tensor whose name ends with ``suffix`` under the shortest prefix (``bert.``, ``roberta.``, none)."""
    names = sorted((k for k in hsd if k == suffix or k.endswith("." + suffix)), key=len)
    return (names[0], hsd[names[0]]) if names else None


def config_tensor_problems(cfg: dict, hsd: dict[str, torch.Tensor]) -> list[str]:
    """Where an HF ``config.json`` disagrees with the weights stored beside it, each naming the config key, its
    value, the tensor and its shape. The model is built from the config and filled from the tensors: without this
    a config with fewer layers than the file silently drops the rest, and other disagreements end in a shape
    error deep in the load (or, for positions and vocabulary, in rows the model never reads)."""
    problems = []

    def rows(key: str, value: int, suffix: str, what: str) -> None:
        found = _find(hsd, suffix)
        if found is not None and isinstance(value, int) and found[1].dim() >= 1 and found[1].shape[0] != value:
            problems.append(f"{key} {value} but {found[0]} has shape {list(found[1].shape)} "
                            f"({found[1].shape[0]} {what})")

    def width(key: str, value: int, suffix: str, dim: int, what: str) -> None:
        found = _find(hsd, suffix)
        if found is not None and isinstance(value, int) and found[1].dim() > dim and found[1].shape[dim] != value:
            problems.append(f"{key} {value} but {found[0]} has shape {list(found[1].shape)} ({what} "
                            f"{found[1].shape[dim]})")

    hidden = cfg.get("hidden_size")
    rows("vocab_size", cfg.get("vocab_size"), "embeddings.word_embeddings.weight", "vocabulary rows")
    rows("type_vocab_size", cfg.get("type_vocab_size"), "embeddings.token_type_embeddings.weight", "token types")
    # RoBERTa's padding_idx + 1 rows before the first real position count in max_position_embeddings too
    rows("max_position_embeddings", cfg.get("max_position_embeddings"), "embeddings.position_embeddings.weight",
         "positions")
    factorised = "embedding_size" in cfg  # ELECTRA's (and ALBERT's) embedding width E may differ from H
    width("embedding_size" if factorised else "hidden_size", cfg["embedding_size"] if factorised else hidden,
          "embeddings.word_embeddings.weight", 1, "width")
    layers = sorted({int(m.group(1)) for k in hsd for m in [_LAYER.search(k)] if m})
    expected = cfg.get("num_hidden_layers")
    if layers and isinstance(expected, int) and layers != list(range(expected)):
        first = next(k for k in sorted(hsd) if _LAYER.search(k))
        where = first[: _LAYER.search(first).start(1)]
        problems.append(f"num_hidden_layers {expected} but the weights hold {len(layers)} layers "
                        f"({where}{{{layers[0]}..{layers[-1]}}}.*)")
    if layers:
        width("hidden_size", hidden, f"encoder.layer.{layers[0]}.attention.self.query.weight", 1, "input width")
        rows("hidden_size", hidden, f"encoder.layer.{layers[0]}.attention.self.query.weight", "output rows")
        rows("intermediate_size", cfg.get("intermediate_size"),
             f"encoder.layer.{layers[0]}.intermediate.dense.weight", "output rows")
        heads = cfg.get("num_attention_heads")
        query = _find(hsd, f"encoder.layer.{layers[0]}.attention.self.query.weight")
        if query is not None and isinstance(heads, int) and heads > 0 and query[1].shape[0] % heads:
            problems.append(f"num_attention_heads {heads} does not divide the {query[1].shape[0]} rows of "
                            f"{query[0]} {list(query[1].shape)}")
    return problems


def check_config_tensors(cfg: dict, hsd: dict[str, torch.Tensor], where: str) -> None:
    """CheckpointError (one line) when ``config.json`` and the weights beside it disagree."""
    problems = config_tensor_problems(cfg, hsd)
    if problems:
        raise CheckpointError(f"{where}/config.json disagrees with the weights beside it: " + "; ".join(problems))


def normalise(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        if not torch.is_tensor(v) or k.endswith("_extra_state"):
            continue
        for te_name, local_name in TE_ALIASES.items():
            if k.endswith(te_name):
                k = k[: -len(te_name)] + local_name
        out[k] = v
    return out


def mcore_to_hf(sd: dict[str, torch.Tensor], shape: ModelShape, vocab_size: int, *, binary_head: bool,
                prefix: str = "bert.") -> dict[str, torch.Tensor]:
    """Full (TP1) megatron-core BertModel state -> HF ``MegatronBertFor{PreTraining,MaskedLM}`` state.

    ``prefix`` is where HF keeps the encoder (``bert.``); MLM head keys go under ``cls.predictions``.
    """
    sd = normalise(sd)
    family = block_type_of(sd)
    h, heads, d = shape.hidden_size, shape.num_attention_heads, shape.hidden_size // shape.num_attention_heads
    word = sd["embedding.word_embeddings.weight"][:vocab_size]
    ours, theirs = _FAMILY_NORMS[family]
    out = {
        f"{prefix}embeddings.word_embeddings.weight": word,
        f"{prefix}embeddings.position_embeddings.weight": sd["embedding.position_embeddings.weight"],
        f"{prefix}embeddings.token_type_embeddings.weight": sd["embedding.tokentype_embeddings.weight"],
        f"{prefix}{theirs}.weight": sd[f"{ours}.weight"],
        f"{prefix}{theirs}.bias": sd[f"{ours}.bias"],
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
        for a, c in (_POST_LN_LAYER_PAIRS if family == "post_ln" else _LAYER_PAIRS).items():
            out[hf + c + ".weight"] = sd[m + a + ".weight"]
            out[hf + c + ".bias"] = sd[m + a + ".bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def hf_to_mcore(hsd: dict[str, torch.Tensor], shape: ModelShape, padded_vocab_size: int, *,
                binary_head: bool, prefix: str = "bert.") -> dict[str, torch.Tensor]:
    """HF ``MegatronBert*`` / ``Bert*`` state -> full (TP1) megatron-core BertModel state (pre-LN / post-LN),
    vocabulary zero-padded."""
    hsd = {untf(k): v for k, v in hsd.items()}
    family = hf_block_type(hsd, prefix)
    h, heads, d = shape.hidden_size, shape.num_attention_heads, shape.hidden_size // shape.num_attention_heads

    def pad(t: torch.Tensor) -> torch.Tensor:
        extra = padded_vocab_size - t.shape[0]
        return torch.cat([t, t.new_zeros((extra,) + tuple(t.shape[1:]))]) if extra > 0 else t

    out = {
        "embedding.word_embeddings.weight": pad(hsd[f"{prefix}embeddings.word_embeddings.weight"]),
        "embedding.position_embeddings.weight": hsd[f"{prefix}embeddings.position_embeddings.weight"],
        "embedding.tokentype_embeddings.weight": hsd[f"{prefix}embeddings.token_type_embeddings.weight"],
    }
    ours, theirs = _FAMILY_NORMS[family]
    out.update({f"{ours}.{p}": hsd[f"{prefix}{theirs}.{p}"] for p in ("weight", "bias")})
    decoder = hsd.get("cls.predictions.decoder.weight")
    if decoder is not None and not torch.equal(decoder, hsd[f"{prefix}embeddings.word_embeddings.weight"]):
        # our LM output layer shares the word embeddings, as BERT's does unless tie_word_embeddings is false
        raise CheckpointError("cls.predictions.decoder.weight differs from the word embeddings (untied "
                              "output embeddings): not supported, the engine ties them")
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
        for a, c in (_POST_LN_LAYER_PAIRS if family == "post_ln" else _LAYER_PAIRS).items():
            out[m + a + ".weight"] = hsd[hf + c + ".weight"]
            out[m + a + ".bias"] = hsd[hf + c + ".bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def untf(key: str) -> str:
    """TF-converted BERT checkpoints (early BioBERT) name LayerNorm parameters gamma/beta."""
    if "LayerNorm." in key:
        if key.endswith(".gamma"):
            return key[: -len("gamma")] + "weight"
        if key.endswith(".beta"):
            return key[: -len("beta")] + "bias"
    return key


def read_tokenizer_json(file) -> tuple[list[str], bool]:
    """(WordPiece tokens in id order, lower-casing) of a ``tokenizers`` ``tokenizer.json``: what transformers 5
    writes instead of ``vocab.txt``. Anything our WordPiece tokenizer would split differently is refused
    (CheckpointError quoting the value): another model type, a subword prefix other than ``##``, accent
    stripping that does not follow lower-casing (BERT strips accents exactly when it lower-cases)."""
    from pathlib import Path

    from bio_megatron.utils.io import load_json

    where = str(file)
    doc = load_json(Path(file))
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        raise CheckpointError(f"{where}: tokenizer model {kind!r}, only a BERT WordPiece tokenizer is supported "
                              "(a BPE/Unigram/SentencePiece model tokenises differently)")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise CheckpointError(f"{where}: continuing_subword_prefix {model['continuing_subword_prefix']!r}, "
                              "only BERT's '##' is supported")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise CheckpointError(f"{where}: model.vocab is not a map from tokens to the ids 0..N-1")
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    lower, strip = _normalizer_case(doc.get("normalizer"))
    if strip != lower:
        raise CheckpointError(f"{where}: normalizer lowercase {lower} with strip_accents {strip}; the engine "
                              "strips accents exactly when it lower-cases, as BERT does")
    return tokens, lower


def _normalizer_case(norm) -> tuple[bool, bool]:
    """(lowercase, strip_accents) of a tokenizers normalizer tree (BertNormalizer's strip_accents null follows
    lowercase, as in BERT)."""
    if not isinstance(norm, dict):
        return False, False
    kind = norm.get("type")
    if kind == "BertNormalizer":
        lower = bool(norm.get("lowercase", True))
        strip = norm.get("strip_accents")
        return lower, lower if strip is None else bool(strip)
    if kind == "Sequence":
        parts = [_normalizer_case(n) for n in norm.get("normalizers") or []]
        return any(p[0] for p in parts), any(p[1] for p in parts)
    return kind == "Lowercase", kind == "StripAccents"
