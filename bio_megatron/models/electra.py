"""ELECTRA (Clark et al. 2020) on megatron-core: a small generator and a post-LN BERT discriminator that share
one embedding, as BioELECTRA and BioM-ELECTRA pretrain them (``model.objective: electra``).

One forward pass is ELECTRA's whole step: the generator reads the masked text and predicts the masked
tokens (vocab-parallel logits, output weight tied to the shared word embeddings); one token per masked
position is drawn from its softmax with the Gumbel-max trick (no gradient); the discriminator reads the
original text with those positions replaced and scores every token as replaced or original.

Module and state-dict names follow Hugging Face's ``ElectraForPreTraining`` / ``ElectraForMaskedLM`` where
they can, and the discriminator's are exactly those of a post-LN :class:`~bio_megatron.models.bert.BioBertModel`
(``embedding.*``, ``encoder.layers.*``), so fine-tuning loads the discriminator like any BERT checkpoint::

    embedding.{word,position,tokentype}_embeddings.weight, embedding.layernorm.{weight,bias}   (shared)
    encoder.layers.<i>.*                                                                          (discriminator)
    discriminator_head.dense.{weight,bias}, discriminator_head.dense_prediction.{weight,bias}
    generator.embeddings_project.{weight,bias}   (only when the generator is narrower than the embedding)
    generator.encoder.layers.<i>.*, generator.lm_head.dense.{weight,bias},
    generator.lm_head.layer_norm.{weight,bias}, generator.output_layer.bias

Pipeline parallelism is refused by the config (the discriminator's input comes out of the generator, which
megatron-core's schedules cannot route back to the first stage); TP, DP and the distributed optimizer are
megatron-core's own. The two heads are plain replicated modules, as ``TaskModel``'s head.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import nn

from bio_megatron.config.family_keys import electra_parameter_count, electra_shapes
from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.models.bert import layer_spec, mask_padded_vocab, transformer_config
from bio_megatron.models.init import on_device
from bio_megatron.models.post_ln import add_embedding_layernorm, is_post_ln
from bio_megatron.utils.errors import ConfigError

__all__ = ["ElectraModel", "build_electra_model", "electra_shapes", "electra_parameter_count", "gumbel_max_sample"]

# Keeps log(u) and log(-log(u)) finite for u drawn as 0 or 1 (float32 uniforms can be exactly 0).
_EPS = 1e-9


def _whole_sequence(hidden: torch.Tensor, config: TransformerConfig) -> torch.Tensor:
    """The encoder's output at every position: with sequence parallelism each TP rank holds its share, and the
    heads (replicated, as BERT's pooler) read all of them. The backward keeps each rank's share of the gradient
    (every rank computes the same heads and loss), as megatron's pooler gathers."""
    if not config.sequence_parallel:
        return hidden
    return tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)


class ElectraDiscriminatorHead(nn.Module):
    """HF ``ElectraDiscriminatorPredictions``: dense (h -> h), GELU, dense_prediction (h -> 1) per token."""

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dense_prediction = nn.Linear(hidden, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(F.gelu(self.dense(hidden))).squeeze(-1)


class ElectraGeneratorHead(nn.Module):
    """HF ``ElectraGeneratorPredictions``: dense (G -> E), GELU, LayerNorm(E)."""

    def __init__(self, hidden: int, embedding: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden, embedding)
        self.layer_norm = nn.LayerNorm(embedding, eps=eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(F.gelu(self.dense(hidden)))


class ElectraGenerator(MegatronModule):
    """The generator behind the shared embedding: projection, post-LN encoder, LM head, vocab-parallel output
    layer whose weight is the shared word embedding (passed in), with its own bias."""

    def __init__(self, config: TransformerConfig, embedding_config: TransformerConfig, spec, padded_vocab: int):
        super().__init__(config=config)
        g, e = config.hidden_size, embedding_config.hidden_size
        # HF builds the projection only when the widths differ; so do we (the key is then absent).
        self.embeddings_project = nn.Linear(e, g) if g != e else None
        if self.embeddings_project is not None:
            # With sequence parallelism it sees this rank's share of the positions: megatron's finalize_model_grads
            # sums the gradients of parameters with this tag over TP (as for the LayerNorms).
            for p in self.embeddings_project.parameters():
                p.sequence_parallel = config.sequence_parallel
        self.encoder = TransformerBlock(config=config, spec=spec, pre_process=True, post_process=True,
                                        post_layer_norm=False)
        self.lm_head = ElectraGeneratorHead(g, e, config.layernorm_epsilon)
        self.output_layer = tensor_parallel.ColumnParallelLinear(
            e, padded_vocab, config=embedding_config, init_method=embedding_config.init_method, bias=True,
            skip_bias_add=False, gather_output=False, skip_weight_param_allocation=True)
        if embedding_config.sequence_parallel:
            # Its input (the masked positions' hidden states) is whole on every rank already: no sequence gather,
            # and the input gradient is all-reduced over TP as without sequence parallelism.
            self.output_layer.sequence_parallel = False
            self.output_layer.allreduce_dgrad = True

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        sd = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        # The vocabulary padding (a multiple of 128 x TP) changes with TP: the bias reshards as the word
        # embeddings do (megatron's LanguageModule marks its output layer the same way).
        sd[f"{prefix}output_layer.bias"].allow_shape_mismatch = True
        return sd

    def forward(self, embedded: torch.Tensor, attention_mask: torch.Tensor, masked: torch.Tensor,
                word_embeddings: torch.Tensor) -> torch.Tensor:
        """``embedded`` [s, b, E] -> this rank's vocabulary slice of the logits at the masked positions
        [n, 1, V/TP], rows in ``masked``'s row-major order (the LM head runs on masked tokens only, as ELECTRA)."""
        hidden = self.embeddings_project(embedded) if self.embeddings_project is not None else embedded
        hidden = _whole_sequence(self.encoder(hidden_states=hidden, attention_mask=attention_mask), self.config)
        hidden = self.lm_head(hidden.transpose(0, 1)[masked]).unsqueeze(1)
        logits, _ = self.output_layer(hidden, weight=word_embeddings)
        return logits


class ElectraModel(MegatronModule):
    """ELECTRA's generator + discriminator at TP x DP (PP 1). ``forward`` returns the generator's per-token
    MLM loss at the masked positions [n], the discriminator's logits [b, s] and which tokens were replaced [b, s]."""

    def __init__(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32):
        super().__init__(config=transformer_config(m, dtype))
        if m.pipeline_model_parallel_size != 1:
            raise ConfigError("model.objective (electra) needs model.pipeline_model_parallel_size=1")
        self.model_type = ModelType.encoder_or_decoder
        self.true_vocab_size = vocab_size
        padded = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
        spec = layer_spec(m)
        if not is_post_ln(spec):
            raise ConfigError("model.objective (electra) trains post-LN BERT: set model.transformer_block_type=post_ln")
        core = spec.submodules.self_attention.submodules.core_attention
        # megatron's unfused attention wants [b,1,s,s]; SDPA a key-padding mask [b,1,1,s] (as TaskModel).
        self.mask_dims = "b1ss" if core is DotProductAttention else "b11s"
        self.embedding = LanguageModelEmbedding(config=self.config, vocab_size=padded,
                                                max_sequence_length=m.max_position_embeddings,
                                                position_embedding_type="learned_absolute",
                                                num_tokentypes=m.num_tokentypes)
        add_embedding_layernorm(self.embedding)
        self.encoder = TransformerBlock(config=self.config, spec=spec, pre_process=True, post_process=True,
                                        post_layer_norm=False)
        self.discriminator_head = ElectraDiscriminatorHead(self.config.hidden_size)
        g = electra_shapes(m)
        gen_m = dataclasses.replace(m, hidden_size=g.hidden_size, ffn_hidden_size=g.ffn_hidden_size,
                                    num_attention_heads=g.num_attention_heads)
        gen_cfg = transformer_config(gen_m, dtype)
        self.generator = ElectraGenerator(gen_cfg, self.config, spec, padded)

    def set_input_tensor(self, input_tensor) -> None:
        """megatron-core's schedules call this with the previous stage's output: always None here (PP 1)."""

    def _embed(self, input_ids: torch.Tensor, tokentype_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        return self.embedding(input_ids=input_ids, position_ids=positions, tokentype_ids=tokentype_ids)

    def _attention_mask(self, padding_mask: torch.Tensor) -> torch.Tensor:
        mask = padding_mask.unsqueeze(1)
        mask = (mask.unsqueeze(2) * mask.unsqueeze(3)) if self.mask_dims == "b1ss" else mask.unsqueeze(1)
        return mask < 0.5  # True = masked out

    def discriminator_logits(self, input_ids: torch.Tensor, padding_mask: torch.Tensor,
                             tokentype_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The discriminator alone (what fine-tuning keeps): one replaced-token logit per token [b, s]."""
        hidden = self.encoder(hidden_states=self._embed(input_ids, tokentype_ids),
                              attention_mask=self._attention_mask(padding_mask))
        return self.discriminator_head(_whole_sequence(hidden, self.config).transpose(0, 1))

    def generator_logits(self, input_ids: torch.Tensor, padding_mask: torch.Tensor,
                         tokentype_ids: torch.Tensor | None, masked: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the generator's logits at the ``masked`` positions [n, 1, V/TP] (padding -inf)."""
        logits = self.generator(self._embed(input_ids, tokentype_ids), self._attention_mask(padding_mask), masked,
                                self.embedding.word_embeddings.weight)
        return mask_padded_vocab(logits, self.true_vocab_size)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor, tokentype_ids: torch.Tensor | None,
                labels: torch.Tensor, loss_mask: torch.Tensor, sample_seeds: list[int]):
        """``input_ids``: the masked text; ``labels``: the original tokens where ``loss_mask`` is 1;
        ``sample_seeds``: one Gumbel-noise seed per sequence (see :func:`gumbel_max_sample`)."""
        masked = loss_mask.bool()
        original = torch.where(masked, labels, input_ids)
        logits = self.generator_logits(input_ids, padding_mask, tokentype_ids, masked)
        # Sample before the loss: megatron's vocab-parallel cross entropy overwrites its logits in place.
        sampled = gumbel_max_sample(logits.squeeze(1), sample_seeds, masked.sum(1).tolist(), self.true_vocab_size)
        generator_loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), original[masked].unsqueeze(1))
        fake = original.masked_scatter(masked, sampled)
        # A sample equal to the original token is not a replacement (ELECTRA's labels).
        replaced = (fake != original) & padding_mask.bool()
        return generator_loss.squeeze(1), self.discriminator_logits(fake, padding_mask, tokentype_ids), replaced


@torch.no_grad()
def gumbel_max_sample(logits: torch.Tensor, seeds: list[int], counts: list[int], vocab_size: int) -> torch.Tensor:
    """One token per row of vocab-parallel ``logits`` [n, V/TP] drawn from their softmax by Gumbel-max,
    identical at every TP size: sequence ``j`` contributes ``counts[j]`` consecutive rows, and its uniform
    noise over the real vocabulary [counts[j], vocab_size] comes from a generator seeded with ``seeds[j]``
    (a pure function of the sample, not of the layout). Each rank takes its vocabulary slice, finds its local
    best ``logit + Gumbel`` and the TP group picks the global winner. The noise spans the real vocabulary,
    not the padded one, because the padding (a multiple of 128 x TP) changes with TP; padded entries hold
    -inf logits and can never win."""
    n, per_rank = logits.shape
    start = ps.get_tensor_model_parallel_rank() * per_rank
    width = max(0, min(per_rank, vocab_size - start))
    noise = torch.zeros(n, per_rank, device=logits.device, dtype=torch.float32)
    row = 0
    for seed, k in zip(seeds, counts):
        if k:
            g = torch.Generator(device=logits.device).manual_seed(seed)
            u = torch.rand(k, vocab_size, generator=g, device=logits.device)
            noise[row:row + k, :width] = -torch.log(-torch.log(u[:, start:start + width] + _EPS) + _EPS)
        row += k
    if row != n:
        raise ValueError(f"gumbel_max_sample: counts sum to {row}, logits have {n} rows")
    best, index = (logits.float() + noise).max(dim=-1)
    index = index + start
    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return index
    group = ps.get_tensor_model_parallel_group()
    bests, indices = [torch.empty_like(best) for _ in range(tp)], [torch.empty_like(index) for _ in range(tp)]
    dist.all_gather(bests, best, group=group)
    dist.all_gather(indices, index, group=group)
    winner = torch.stack(bests).argmax(dim=0)  # ties: the lowest rank, i.e. the lowest id (as TP 1's argmax)
    return torch.stack(indices).gather(0, winner.unsqueeze(0)).squeeze(0)


def build_electra_model(m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32) -> ElectraModel:
    """This rank's ELECTRA model (weights NOT initialised: call ``init_weights``, as for ``build_model``)."""
    return on_device(ElectraModel(m, vocab_size, dtype), dtype)
