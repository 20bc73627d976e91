"""Post-LayerNorm BERT (the original BERT / BioBERT / PubMedBERT layer order) as a megatron-core layer spec.

Original BERT normalises *after* each residual add::

    x = LN_attn(x + dropout(attn(x)));  x = LN_mlp(x + dropout(mlp(x)))

with a LayerNorm on the embedding sum (word + position + token type, before the embedding dropout) and no
final LayerNorm, whereas Megatron BERT (pre-LN) normalises each sub-layer's input and ends with a final
LayerNorm. The pre-LN spec's attention, MLP and bias-dropout-add modules are reused unchanged: only the
layer's ``forward`` (where the two LayerNorms sit) differs, so TP/PP/DP, the distributed optimizer and
dist-checkpointing work exactly as for pre-LN. The new LayerNorms are ordinary replicated modules whose
sharded keys (``encoder.layers.post_attention_layernorm.*``, ``encoder.layers.post_mlp_layernorm.*``,
``embedding.layernorm.*``) reshard like every other LayerNorm; the embedding one lives where the embedding
lives (the first pipeline stage only).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from megatron.core.models.bert.bert_layer_specs import LNImpl, bert_layer_local_spec
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from bio_megatron.models.sequence_parallel import norm_class

BLOCK_TYPES = ("pre_ln", "post_ln")


@dataclass
class PostLNLayerSubmodules(TransformerLayerSubmodules):
    """The pre-LN submodules (input / pre-MLP LayerNorms set to identity) plus the two post-add LayerNorms."""

    post_attention_layernorm: type = LNImpl
    post_mlp_layernorm: type = LNImpl


class PostLNTransformerLayer(TransformerLayer):
    """``TransformerLayer`` whose LayerNorms follow the residual adds (BERT's original order).

    megatron-core's ``_forward_attention`` / ``_forward_mlp`` compute ``x + dropout(f(norm(x)))``; with their
    input norms set to identity in the spec they compute ``x + dropout(f(x))``, and this layer normalises each
    sum. megatron-core's recompute works unchanged: full recompute calls this ``forward``, and selective
    recompute lives in the parent's attention (core_attn) and ``_forward_mlp`` (mlp); the post-add LayerNorms are
    not recomputed (megatron's layernorm option covers the input / pre-MLP norms, identities here). CUDA graphs
    and fused inference kernels of the parent are not used by this project.
    """

    def __init__(self, config, submodules: PostLNLayerSubmodules, *args, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        if not isinstance(self.input_layernorm, IdentityOp) or not isinstance(self.pre_mlp_layernorm, IdentityOp):
            raise ValueError("PostLNTransformerLayer needs input_layernorm and pre_mlp_layernorm = IdentityOp")
        norm = dict(config=self.config, hidden_size=self.config.hidden_size, eps=self.config.layernorm_epsilon)
        self.post_attention_layernorm = submodules.post_attention_layernorm(**norm)
        self.post_mlp_layernorm = submodules.post_mlp_layernorm(**norm)

    def forward(self, *args, **kwargs):
        hidden_states, context = self._forward_attention(*args, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self._forward_mlp(hidden_states, kwargs.get("inference_context"),
                                          padding_mask=kwargs.get("padding_mask"),
                                          packed_seq_params=kwargs.get("packed_seq_params"))
        return self.post_mlp_layernorm(hidden_states), context


def post_ln_layer_spec(base: ModuleSpec = bert_layer_local_spec) -> ModuleSpec:
    """The local (or SDPA) pre-LN spec with its LayerNorms moved after the residual adds.

    ``base`` must be a local-spec variant (separate LayerNorm modules); Transformer Engine's spec fuses the
    LayerNorm into the following linear, which cannot express post-LN.
    """
    spec = copy.deepcopy(base)
    sub = spec.submodules
    fields = {f: getattr(sub, f) for f in TransformerLayerSubmodules.__dataclass_fields__}
    fields.update(input_layernorm=IdentityOp, pre_mlp_layernorm=IdentityOp,
                  # the pre-LN spec saves its norms under TE's fused names; post-LN norms keep their own
                  sharded_state_dict_keys_map={})
    return ModuleSpec(module=PostLNTransformerLayer, params=dict(spec.params),
                      submodules=PostLNLayerSubmodules(**fields))


def is_post_ln(spec: ModuleSpec) -> bool:
    """Whether a layer spec builds post-LN layers (models then add the embedding LN and drop the final one)."""
    module = getattr(spec, "module", None)
    return isinstance(module, type) and issubclass(module, PostLNTransformerLayer)


class _NormThenDropout(torch.nn.Module):
    """Stands in for ``LanguageModelEmbedding.embedding_dropout``: LayerNorm, then the original dropout.

    megatron's embedding forward sums word + position + token-type embeddings and then calls its dropout;
    normalising at that call is exactly BERT's ``dropout(LayerNorm(sum))`` without re-implementing the
    embedding. The LayerNorm is registered on the embedding (``embedding.layernorm``), referenced here
    through a tuple so that its weights appear once in the state dict.
    """

    def __init__(self, norm: torch.nn.Module, dropout: torch.nn.Module):
        super().__init__()
        self._norm = (norm,)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self._norm[0](x))


def add_embedding_layernorm(embedding: LanguageModelEmbedding) -> None:
    """Give a built megatron-core embedding BERT's embedding LayerNorm (before its dropout)."""
    c = embedding.config
    # With sequence parallelism megatron's embedding calls its dropout on this rank's share of the positions,
    # inside the model-parallel RNG fork: the LayerNorm is per position, so normalising there is still BERT's
    # order; its weights then carry megatron's sequence_parallel tag (their gradients are summed over TP).
    embedding.layernorm = norm_class(c, LNImpl)(config=c, hidden_size=c.hidden_size, eps=c.layernorm_epsilon)
    embedding.embedding_dropout = _NormThenDropout(embedding.layernorm, embedding.embedding_dropout)


def drop_final_layernorm(encoder: TransformerBlock) -> None:
    """Post-LN ends with the last layer's own LayerNorm: remove the block's final one (``BertModel`` builds
    its ``TransformerBlock`` with ``post_layer_norm=True`` and offers no switch)."""
    encoder.final_layernorm = None
