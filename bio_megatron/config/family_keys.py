"""The keys and limits of one family or objective, checked with the rest of the model config before anything is
built: ELECTRA's generator (its shape, derived from the discriminator's, and the exact parameter count of the pair),
ALBERT's one shared layer, ModernBERT's attention. The family objects (``bio_megatron/families/``) sit above the
config layer; what the config needs to know of a family to refuse a config is here, one function per family.

``m`` is a :class:`~bio_megatron.config.pretrain.ModelConfig` whose encoder keys are already valid (typed ``Any``:
``config/pretrain.py`` imports this module, so importing it back, even for typing, would be a cycle)."""

from __future__ import annotations

from typing import Any

from bio_megatron.config.sizes import SIZES, ModelShape, parameter_count
from bio_megatron.config.values import outside


def electra_shapes(m: Any) -> ModelShape:
    """The ELECTRA generator's shape (Clark et al. 2020): the discriminator's depth, hidden size
    ``round(generator_hidden_fraction x hidden_size)``, FFN 4x that, and heads of width 64 as ELECTRA
    (``max(1, G // 64)``), narrower only when the discriminator's heads are (tiny test sizes), so that a tiny
    generator still has several heads to split across tensor-parallel ranks."""
    s = m.shape()
    g = max(1, round(s.hidden_size * m.generator_hidden_fraction))
    head_dim = min(64, max(1, s.hidden_size // max(1, s.num_attention_heads)))
    return ModelShape(num_layers=s.num_layers, hidden_size=g, num_attention_heads=max(1, g // head_dim),
                      ffn_hidden_size=4 * g, status=s.status)


def electra_parameter_count(m: Any, padded_vocab: int) -> int:
    """Exact parameter count of :class:`bio_megatron.models.electra.ElectraModel` (the shared embedding once):
    the post-LN BERT count with a 1-logit head instead of the LM head, plus the generator."""
    d, g = m.shape(), electra_shapes(m)
    h, gh = d.hidden_size, g.hidden_size
    # post-LN BERT (embedding LN instead of the final LN: the same count) minus its LM head plus ELECTRA's head
    discriminator = parameter_count(d, padded_vocab, m.max_position_embeddings, m.num_tokentypes) \
        - (h * h + 3 * h + padded_vocab) + (h * h + h + h + 1)
    layers = parameter_count(g, 0, 0, 0) - (2 * gh + gh * gh + 3 * gh)  # without final LN and LM head
    project = h * gh + gh if gh != h else 0
    lm_head = gh * h + h + 2 * h + padded_vocab  # dense, LayerNorm, output bias (weight tied)
    return discriminator + layers + project + lm_head


def electra_problems(m: Any) -> list[str]:
    """What ``model.objective: electra`` needs (checked once the encoder itself is valid)."""
    problems = []
    if m.bert_binary_head:
        problems.append("model.objective (electra) has no next-sentence task: set model.bert_binary_head=false")
    problems += _one_stage(m, "model.objective (electra)", "the discriminator's input is the generator's sampled "
                           "output, which megatron-core's pipeline schedules cannot send back to the first stage")
    problems += _block(m, "model.objective (electra) trains the original post-LN BERT", "post_ln")
    if outside(m.generator_hidden_fraction, 0.0, 1.0, lo_open=True, hi_open=False):
        problems.append(f"model.generator_hidden_fraction ({m.generator_hidden_fraction}) must be in (0, 1]")
    if outside(m.discriminator_loss_weight, 0.0, lo_open=True):
        problems.append(f"model.discriminator_loss_weight ({m.discriminator_loss_weight}) must be a finite "
                        "number > 0")
    if problems or m.size not in SIZES:
        return problems
    g, tp = electra_shapes(m), m.tensor_model_parallel_size
    if g.hidden_size % g.num_attention_heads:
        problems.append(f"generator hidden size ({g.hidden_size} = model.generator_hidden_fraction "
                        f"{m.generator_hidden_fraction} x {m.shape().hidden_size}) must be divisible by its "
                        f"{g.num_attention_heads} heads")
    if tp >= 1 and g.num_attention_heads % tp:
        problems.append(f"generator heads ({g.num_attention_heads}, hidden {g.hidden_size}) must be divisible by "
                        f"tensor_model_parallel_size ({tp}): raise model.generator_hidden_fraction")
    return problems


def modernbert_problems(m: Any) -> list[str]:
    """What ``model.family: modernbert`` (``bio_megatron/models/modernbert.py``) cannot do, and its keys elsewhere."""
    keys = ("global_rope_theta", "local_rope_theta", "local_attention", "global_attn_every_n_layers")
    if m.family != "modernbert":
        return [f"model.{k} ({getattr(m, k)}) applies to model.family modernbert only (got family {m.family})"
                for k in keys if getattr(m, k) is not None]
    problems = [f"model.{k} ({getattr(m, k)}) must be > 0" for k in keys
                if getattr(m, k) is not None and not getattr(m, k) > 0]
    problems += _block(m, "model.family (modernbert) is pre-LN", "pre_ln") + _no_sequence_parallel(m)
    # bert: megatron-core's BERT samples; mlm: RoBERTa's rows, which model.data.packing fills with whole documents
    if m.objective not in ("bert", "mlm") or m.bert_binary_head:
        problems.append(f"model.family (modernbert) pretrains with model.objective=bert (or mlm) and "
                        f"model.bert_binary_head=false (MLM only), got {m.objective} and "
                        f"{str(m.bert_binary_head).lower()}")
    if m.transformer_impl == "transformer_engine":
        problems.append("model.transformer_impl (transformer_engine) is not implemented for model.family modernbert "
                        "(its rotary bases and local window live in megatron-core's local spec): use local or auto")
    return problems


def albert_problems(m: Any) -> list[str]:
    """What ``model.family: albert`` (``bio_megatron/models/albert.py``) cannot do, and ALBERT's keys elsewhere."""
    if m.family != "albert":
        return [f"model.{k} ({v}) applies to model.family albert only (got family {m.family})" for k, v in (
            ("embedding_size", m.embedding_size), ("hidden_act", m.hidden_act))
            if v is not None and not (k == "hidden_act" and v == "gelu")]
    problems = _one_stage(m, "model.family (albert)", "its one shared layer would sit on every stage, and "
                          "megatron-core sums gradients across stages only for the word embeddings")
    problems += _block(m, "model.family (albert) is post-LN", "post_ln") + _no_sequence_parallel(m)
    if m.activations_checkpoint_granularity == "full":
        problems.append("model.activations_checkpoint_granularity (full) is not implemented for model.family albert "
                        "(one shared layer): use selective or null")
    if m.objective != "bert":
        problems.append(f"model.family (albert) pretrains with model.objective=bert (MLM + SOP), got {m.objective}")
    if m.embedding_size is not None and m.embedding_size < 1:
        problems.append(f"model.embedding_size ({m.embedding_size}) must be >= 1")
    return problems


def _one_stage(m: Any, who: str, why: str) -> list[str]:
    if m.pipeline_model_parallel_size == 1:
        return []
    return [f"{who} needs model.pipeline_model_parallel_size=1 (got {m.pipeline_model_parallel_size}): {why}"]


def _block(m: Any, who: str, block: str) -> list[str]:
    if m.transformer_block_type == block:
        return []
    return [f"{who}: set model.transformer_block_type={block} (got {m.transformer_block_type})"]


def _no_sequence_parallel(m: Any) -> list[str]:
    return [f"model.sequence_parallel (true) is not implemented for model.family {m.family}: set it false"] \
        if m.sequence_parallel else []
