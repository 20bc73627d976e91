"""Checks of ``model.data.packing`` (whole documents per row, no attention across them; ``data/packing.py``).

What cannot pack is refused before anything is built, in one line each, naming the key and why.
"""

from __future__ import annotations

from typing import Any


PACKING_FAMILIES = (None, "megatron_bert", "bert", "roberta", "electra", "modernbert")
"""Families whose encoders take the per-document block mask and restart positions per document (None: inferred,
one of the BERT-shaped ones): megatron-core's attention mask and learned positions as given, or ModernBERT's rotary
positions restarting per document with its local band inside the block mask (``models/modernbert.py``); ALBERT's
shared layer builds its own masks."""


def packing_problems(m: Any) -> list[str]:
    """``model.data.packing`` against the objective, family and attention implementation (``m``: a ``ModelConfig``)."""
    mode = m.data.packing
    if mode is None:
        return []
    key = f"model.data.packing ({mode})"
    problems = []
    if m.objective != "mlm":
        # megatron-core's BERT samples never cross a document (nothing attends across one to remove) and fill the
        # length but for short_seq_prob's share, kept short on purpose; with NSP/SOP the pooler reads position 0
        # only, so a packed row's second pair would have no binary target.
        problems.append(f"{key} packs RoBERTa's rows: it needs model.objective mlm (got {m.objective}); "
                        "megatron-core's BERT samples already hold one document each, filled to the length")
    if m.family not in PACKING_FAMILIES:
        problems.append(f"{key} is implemented for the BERT-shaped families ({', '.join(PACKING_FAMILIES[1:])}), "
                        f"not model.family {m.family}: set model.data.packing null")
    if m.transformer_impl == "transformer_engine":
        problems.append(f"{key} needs model.transformer_impl local or auto: Transformer Engine's BERT spec takes "
                        "[b, 1, 1, s] padding masks, not a per-document block mask")
    return problems


def finetune_packing_problems(m: Any, packing: bool) -> list[str]:
    """``model.dataset.packing`` (NER and classification) against the layout and attention implementation."""
    if not packing:
        return []
    key = "model.dataset.packing (true)"
    problems = []
    if m.pipeline_model_parallel_size != 1:
        problems.append(f"{key} needs model.pipeline_model_parallel_size=1 (got {m.pipeline_model_parallel_size}): "
                        "packed rows are laid back out per example after the last layer, on one stage")
    if m.sequence_parallel:
        problems.append(f"{key} is not implemented with model.sequence_parallel: set one of them false")
    if m.family not in PACKING_FAMILIES:
        problems.append(f"{key} is implemented for the BERT-shaped families ({', '.join(PACKING_FAMILIES[1:])}), "
                        f"not model.family {m.family}: set it false")
    if m.transformer_impl == "transformer_engine":
        problems.append(f"{key} needs model.transformer_impl local or auto: Transformer Engine's BERT spec takes "
                        "[b, 1, 1, s] padding masks, not a per-example block mask")
    return problems
