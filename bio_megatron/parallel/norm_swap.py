"""The LayerNorm classes megatron-core's ``TransformerBlock`` and BERT LM head build, swapped while a model is built.

Both modules choose their norm class from a module-level name at construction; with sequence parallelism and
megatron's PyTorch fallback norm (no apex/TE), :mod:`bio_megatron.models.sequence_parallel` needs its own class
there. Installed from the seam (``with seam.install("build", norm_for=...)``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def fallback_norms(norm_for: Callable[[type], type]) -> Iterator[None]:
    """While the block runs, each of the two names holds ``norm_for(<megatron's class>)``."""
    from megatron.core.models.bert import bert_lm_head
    from megatron.core.transformer import transformer_block

    saved = transformer_block.LayerNormImpl, bert_lm_head.LNImpl
    transformer_block.LayerNormImpl = norm_for(saved[0])
    bert_lm_head.LNImpl = norm_for(saved[1])
    try:
        yield
    finally:
        transformer_block.LayerNormImpl, bert_lm_head.LNImpl = saved
