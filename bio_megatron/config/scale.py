"""Checks of the keys that trade compute or communication for memory: activation recomputation (NeMo's
``activations_checkpoint_*``) and sequence parallelism.

Both are megatron-core's own mechanisms (``TransformerConfig.recompute_*`` and ``sequence_parallel``, wired in
``bio_megatron.models.bert.transformer_config``); megatron-core checks some of the same things with an assert or
a ``ValueError`` naming its own field names, mid-way through building the model. Here every problem is reported
before anything is built, with our key names and the values given.
"""

from __future__ import annotations

from typing import Any

GRANULARITIES = ("selective", "full")
METHODS = ("uniform", "block")


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value)


def recompute_problems(m: Any) -> list[str]:
    """``model.activations_checkpoint_granularity`` / ``_method`` / ``_num_layers`` (``m`` is a ``ModelConfig``;
    its shape must already be valid)."""
    g, method, n = m.activations_checkpoint_granularity, m.activations_checkpoint_method, \
        m.activations_checkpoint_num_layers
    pp = max(1, m.pipeline_model_parallel_size)
    per_stage = m.shape().num_layers // pp
    key = "model.activations_checkpoint_"
    if g is None:
        given = [f"{key}{k} ({v})" for k, v in (("method", method), ("num_layers", n)) if v is not None]
        return [f"{', '.join(given)} set without {key}granularity: set it to selective or full, or remove "
                f"{'them' if len(given) > 1 else 'it'}"] if given else []
    if g not in GRANULARITIES:  # (the loader checks the literal; a dict built in code may not)
        return [f"{key}granularity ({g!r}) must be selective, full or null"]
    problems = []
    if g == "full":
        if method not in METHODS:
            problems.append(f"{key}granularity (full) needs {key}method uniform (groups of num_layers layers, "
                            f"each keeping only its input) or block (the first num_layers layers of each pipeline "
                            f"stage), got {_yaml(method)}")
        if n is None or isinstance(n, bool) or not 1 <= n <= per_stage:
            stage = f" per pipeline stage ({m.shape().num_layers} / {pp})" if pp > 1 else ""
            problems.append(f"{key}num_layers ({_yaml(n)}) must be between 1 and the {per_stage} layers{stage} "
                            f"for {key}granularity full")
        return problems
    # selective: megatron-core recomputes the core attention of every layer; it takes no layer selection.
    if method not in (None, "uniform"):
        problems.append(f"{key}method ({method}) does not apply to {key}granularity selective, which recomputes "
                        "the core attention of every layer (NeMo's uniform); set it to null or uniform")
    if n is not None:
        problems.append(f"{key}num_layers ({n}) must be null for {key}granularity selective (megatron-core "
                        "recomputes the core attention of every layer)")
    return problems


def sequence_parallel_problems(m: Any, pretraining: bool) -> list[str]:
    """``model.sequence_parallel``: TP >= 2, a sequence length TP divides, a model that gathers the sequence
    back where a head reads it (pretraining's BERT and ELECTRA; not the fine-tuning heads)."""
    if not m.sequence_parallel:
        return []
    tp, seq = m.tensor_model_parallel_size, m.encoder_seq_length
    if tp < 2:
        return [f"model.sequence_parallel (true) needs model.tensor_model_parallel_size >= 2 (got {tp}): it splits "
                "the activations between the tensor-parallel layers along the sequence over the TP ranks"]
    problems = []
    if seq % tp:
        problems.append(f"model.encoder_seq_length ({seq}) must be divisible by model.tensor_model_parallel_size "
                        f"({tp}) with model.sequence_parallel: each TP rank holds seq / TP positions")
    if not pretraining:
        problems.append("model.sequence_parallel (true) is for pretraining: the fine-tuning heads read every "
                        "position of the encoder's output; fine-tune with model.sequence_parallel=false")
    return problems
