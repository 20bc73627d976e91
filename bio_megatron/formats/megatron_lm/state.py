"""Megatron-LM legacy BERT state dicts <-> our full (TP1) megatron-core state, shard by shard.

Megatron-LM's legacy ``BertModel.state_dict_for_save_checkpoint`` nests its weights::

    language_model: embedding: {word_embeddings, position_embeddings, tokentype_embeddings}: {weight}
                    encoder (older files: transformer): {layers.N.<op>.{weight,bias}, final_layernorm.*}
                    pooler: {dense.weight, dense.bias}                  (only with the binary head)
    lm_head: {bias, dense.*, layernorm.*}    binary_head: {weight, bias}
    word_embeddings_for_head: {weight}       (last pipeline stage only: a copy of the tied embedding)

Layer indices are local to a pipeline stage. Names drifted over the years and Megatron-LM's own loader
accepts all of them: ``attention.`` for ``self_attention.``, ``transformer`` for ``encoder`` and ``norm``
for ``layernorm``; so does :func:`legacy_to_mcore`. We write the older spellings, which both Megatron-LM's
loader and transformers' converter read.

Tensor parallelism splits the word embeddings, the LM bias, the QKV and ``dense_h_to_4h`` rows (column
parallel) and the ``dense`` / ``dense_4h_to_h`` columns (row parallel); everything else is replicated.

The QKV rows of one shard, for its ``np`` heads of width ``hn``, depend on ``checkpoint_version``
(Megatron-LM's ``fix_query_key_value_ordering``): 0 stores ``[3, np, hn]``, 1 stores ``[np, hn, 3]``,
2 and later ``[np, 3, hn]``, which is also megatron-core's ``linear_qkv`` layout.
"""

from __future__ import annotations

import re

import torch

from bio_megatron.utils.errors import CheckpointError

# our layer op <-> legacy layer op (inside encoder.layers.N.)
LAYER_OPS = {
    "input_layernorm": "input_layernorm",
    "self_attention.linear_qkv": "self_attention.query_key_value",
    "self_attention.linear_proj": "self_attention.dense",
    "pre_mlp_layernorm": "post_attention_layernorm",
    "mlp.linear_fc1": "mlp.dense_h_to_4h",
    "mlp.linear_fc2": "mlp.dense_4h_to_h",
}
_LEGACY_OPS = {v: k for k, v in LAYER_OPS.items()}
# our non-layer names -> legacy flat names
TOP = {
    "embedding.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
    "embedding.position_embeddings.weight": "language_model.embedding.position_embeddings.weight",
    "embedding.tokentype_embeddings.weight": "language_model.embedding.tokentype_embeddings.weight",
    "encoder.final_layernorm.weight": "language_model.encoder.final_layernorm.weight",
    "encoder.final_layernorm.bias": "language_model.encoder.final_layernorm.bias",
    "pooler.dense.weight": "language_model.pooler.dense.weight",
    "pooler.dense.bias": "language_model.pooler.dense.bias",
    "lm_head.dense.weight": "lm_head.dense.weight",
    "lm_head.dense.bias": "lm_head.dense.bias",
    "lm_head.layer_norm.weight": "lm_head.layernorm.weight",
    "lm_head.layer_norm.bias": "lm_head.layernorm.bias",
    "output_layer.bias": "lm_head.bias",
    "binary_head.weight": "binary_head.weight",
    "binary_head.bias": "binary_head.bias",
}
_LEGACY_TOP = {v: k for k, v in TOP.items()}
_LAYER_RE = re.compile(r"^language_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_SPLIT_ROWS = ("embedding.word_embeddings.weight", "output_layer.bias", "linear_qkv.weight", "linear_qkv.bias",
               "linear_fc1.weight", "linear_fc1.bias")
_SPLIT_COLS = ("linear_proj.weight", "linear_fc2.weight")


def split_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits ``name`` (ours) along, or None when it is replicated."""
    if name.endswith(_SPLIT_ROWS):
        return 0
    if name.endswith(_SPLIT_COLS):
        return 1
    return None


def flatten(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Nested Megatron-LM state -> ``a.b.c`` names (files mix nesting and dotted keys)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif torch.is_tensor(value):
            out[name] = value
    return out


def _canonical(name: str) -> str:
    """Every spelling Megatron-LM's loader accepts -> the one :data:`TOP` / :data:`LAYER_OPS` use."""
    name = name.replace("language_model.transformer.", "language_model.encoder.").replace(".attention.",
                                                                                          ".self_attention.")
    name = re.sub(r"(?<![a-z])(input|post_attention|final)_norm\.", r"\1_layernorm.", name)
    return re.sub(r"^lm_head\.norm\.", "lm_head.layernorm.", name)


def fix_qkv(t: torch.Tensor, version: float, heads: int, where: str) -> torch.Tensor:
    """One shard's QKV rows from ``version``'s layout to ``[np, 3, hn]`` (megatron-core's)."""
    rest = tuple(t.shape[1:])
    hn = t.shape[0] // (3 * heads)
    if version == 0:
        t = t.reshape(3, heads, hn, *rest).transpose(0, 1)
    elif version == 1:
        t = t.reshape(heads, hn, 3, *rest).transpose(1, 2)
    elif version < 2:
        raise CheckpointError(f"{where}: checkpoint_version {version} is not one Megatron-LM wrote (0, 1, 2, 3)")
    return t.contiguous().reshape(3 * heads * hn, *rest)


def legacy_to_mcore(flat: dict[str, torch.Tensor], version: float, heads_per_shard: int,
                    where: str) -> dict[str, torch.Tensor]:
    """One shard's flat legacy names -> our names (local layer indices, QKV in megatron-core's layout)."""
    out: dict[str, torch.Tensor] = {}
    for raw, value in flat.items():
        name = _canonical(raw)
        if name == "word_embeddings_for_head.weight":
            continue  # the last stage's copy of the tied word embeddings
        layer = _LAYER_RE.match(name)
        if layer:
            op = _LEGACY_OPS.get(layer.group(2))
            if op is None:
                raise CheckpointError(f"{where}: unexpected weight {raw} (not a Megatron BERT layer)")
            if op == "self_attention.linear_qkv":
                value = fix_qkv(value, version, heads_per_shard, where)
            out[f"encoder.layers.{layer.group(1)}.{op}.{layer.group(3)}"] = value
        elif name in _LEGACY_TOP:
            out[_LEGACY_TOP[name]] = value
        else:
            raise CheckpointError(f"{where}: unexpected weight {raw} (not part of Megatron-LM's BERT)")
    return out


def merge_tp(shards: list[dict[str, torch.Tensor]], where: str) -> dict[str, torch.Tensor]:
    """Tensor-parallel shards of one pipeline stage (our names) -> the stage's full tensors."""
    out = {}
    for name in shards[0]:
        if any(name not in s for s in shards):
            raise CheckpointError(f"{where}: {name} is missing from some tensor-parallel shards")
        dim = split_dim(name)
        out[name] = shards[0][name] if dim is None else torch.cat([s[name] for s in shards], dim=dim)
    return out


def merge_pp(stages: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pipeline stages (local layer indices) -> one state with global layer indices."""
    out, offset = {}, 0
    for stage in stages:
        count = 0
        for name, value in stage.items():
            m = re.match(r"^encoder\.layers\.(\d+)\.(.+)$", name)
            if m:
                count = max(count, int(m.group(1)) + 1)
                out[f"encoder.layers.{int(m.group(1)) + offset}.{m.group(2)}"] = value
            else:
                out[name] = value
        offset += count
    return out


def mcore_to_legacy_shards(full: dict[str, torch.Tensor], tp: int) -> list[dict]:
    """Our full state -> ``tp`` nested ``model`` dicts as Megatron-LM's legacy BERT saves them (one stage)."""
    shards = []
    for rank in range(tp):
        flat: dict[str, torch.Tensor] = {}
        for name, value in full.items():
            dim = split_dim(name)
            if dim is not None:
                value = value.chunk(tp, dim=dim)[rank]
            layer = re.match(r"^encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", name)
            key = (f"language_model.encoder.layers.{layer.group(1)}.{LAYER_OPS[layer.group(2)]}.{layer.group(3)}"
                   if layer else TOP[name])
            flat[key] = value.detach().clone().contiguous()
        shards.append(_nest(flat))
    return shards


def _nest(flat: dict[str, torch.Tensor]) -> dict:
    """Flat legacy names -> Megatron-LM's nesting. Layers come in order, weight before bias, and
    ``final_layernorm`` after the layers: readers such as transformers' converter depend on that order."""
    ops = list(LAYER_OPS.values())

    def order(key: str) -> tuple:
        m = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", key)
        if m is None:  # final_layernorm.*
            return (1, 0, 0, key.endswith("bias"))
        return (0, int(m.group(1)), ops.index(m.group(2)), m.group(3) == "bias")

    lm: dict = {"embedding": {}, "encoder": {}}
    model: dict = {"language_model": lm}
    encoder = {}
    for key, value in flat.items():
        if key.startswith("language_model.embedding."):
            part = key[len("language_model.embedding."):].split(".")[0]
            lm["embedding"][part] = {"weight": value}
        elif key.startswith("language_model.encoder."):
            encoder[key[len("language_model.encoder."):]] = value
        elif key.startswith("language_model.pooler."):
            lm.setdefault("pooler", {})[key[len("language_model.pooler."):]] = value
        else:
            head, rest = key.split(".", 1)
            model.setdefault(head, {})[rest] = value
    lm["encoder"] = {k: encoder[k] for k in sorted(encoder, key=order)}
    return model


# --- what a Megatron-LM run's args say (legacy and torch_dist) ----------------------------------------
def args_problems(a: dict, distributed: bool = False) -> list[str]:
    """Settings of the Megatron-LM run that our BERT cannot reproduce exactly. (A distributed checkpoint
    stores layers globally, so a virtual pipeline is no obstacle there.)"""
    bad = []
    if a.get("openai_gelu"):
        bad.append("openai_gelu true (tanh-approximated GELU; the engine computes exact GELU)")
    for key in ("swiglu", "squared_relu", "apply_layernorm_1p", "untie_embeddings_and_output_weights",
                "apply_residual_connection_post_layernorm", "group_query_attention"):
        if a.get(key):
            bad.append(f"{key} true (not Megatron BERT's architecture)")
    if a.get("position_embedding_type") not in (None, "learned_absolute") or a.get("add_position_embedding") is False:
        bad.append(f"position_embedding_type {a.get('position_embedding_type')!r} "
                   f"(add_position_embedding {a.get('add_position_embedding')}); only learned absolute is supported")
    if a.get("normalization") not in (None, "LayerNorm"):
        bad.append(f"normalization {a.get('normalization')!r} (only LayerNorm is supported)")
    if a.get("add_bias_linear") is False:
        bad.append("add_bias_linear false (the engine's linear layers have biases)")
    for key in ("qk_layernorm", "multi_latent_attention", "num_experts"):
        if a.get(key):
            bad.append(f"{key} {a[key]} (not Megatron BERT's architecture)")
    if not distributed and (a.get("virtual_pipeline_model_parallel_size") or 1) > 1:
        bad.append(f"virtual_pipeline_model_parallel_size {a['virtual_pipeline_model_parallel_size']} (not supported)")
    heads, hidden = a.get("num_attention_heads"), a.get("hidden_size")
    if a.get("kv_channels") and heads and hidden and a["kv_channels"] != hidden // heads:
        bad.append(f"kv_channels {a['kv_channels']} != hidden_size/num_attention_heads ({hidden // heads})")
    tok = a.get("tokenizer_type")
    if tok is not None and not str(tok).startswith("BertWordPiece"):
        bad.append(f"tokenizer_type {tok!r} (only BertWordPieceCase / BertWordPieceLowerCase vocabularies are read)")
    return bad


def shape_of_state(state: dict, a: dict, heads: int, where: str) -> dict:
    """The encoder shape (ModelConfig fields) of a full TP1 state, checked against the run's args ``a``."""
    need = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
            "encoder.final_layernorm.weight"]
    absent = [k for k in need if k not in state]
    if absent:
        raise CheckpointError(f"{where}: weights {absent} are missing (not a Megatron BERT checkpoint?)")
    layers = 1 + max((int(k.split(".")[2]) for k in state if k.startswith("encoder.layers.")), default=-1)
    hidden = state["embedding.word_embeddings.weight"].shape[1]
    found = {"num_layers": layers, "hidden_size": hidden,
             "padded_vocab_size": state["embedding.word_embeddings.weight"].shape[0],
             "max_position_embeddings": state["embedding.position_embeddings.weight"].shape[0],
             "ffn_hidden_size": state["encoder.layers.0.mlp.linear_fc1.weight"].shape[0] if layers else 4 * hidden}
    wrong = [f"args.{k} {a[k]} but the weights have {v}" for k, v in found.items() if a.get(k) not in (None, v)]
    if hidden % heads:
        wrong.append(f"hidden_size ({hidden}) not divisible by num_attention_heads ({heads})")
    if wrong:
        raise CheckpointError(f"{where}: inconsistent checkpoint: " + "; ".join(wrong))
    tokentypes = state.get("embedding.tokentype_embeddings.weight")
    return {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": found["ffn_hidden_size"], "max_position_embeddings": found["max_position_embeddings"],
            "num_tokentypes": tokentypes.shape[0] if tokentypes is not None else 2,
            # Megatron-LM's default epsilon (1e-5) applies to files whose args do not say (norm_epsilon since 2023)
            "layernorm_epsilon": float(a.get("norm_epsilon") or a.get("layernorm_epsilon") or 1e-5)}
