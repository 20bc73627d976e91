"""The one in-memory value every checkpoint format is read into and written from.

A :class:`ModelState` is a model at TP1 in our own tensor names (megatron-core's local spec: what
``models/hf_convert.normalise`` gives), with what a writer needs beside the tensors: the shape (a ``ModelConfig``, or
a fine-tuning config's ``model`` section), the family, the vocabulary file and its casing, and for a fine-tuned
model its task, labels, head tensors and head settings. The vocabulary rows are the real ones (``vocab_size``):
padding is each writer's business, since each pads for its own TP size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from bio_megatron.config.sizes import ModelShape

# Tensors with one row per vocabulary entry (Megatron pads them to a multiple of 128 x TP); ELECTRA's generator
# has its own ``generator.output_layer.bias``.
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.bias")


@dataclass
class ModelState:
    """A model between formats: TP1 tensors in our names plus everything a writer needs beside them."""

    tensors: dict[str, torch.Tensor]
    """Encoder and pretraining heads (MLM, NSP/SOP), our TP1 names, ``vocab_size`` vocabulary rows."""
    model: object
    """``ModelConfig`` (pretraining) or the fine-tuning config's model section: shape, layer order, casing."""
    family: str
    """The registry name (:data:`bio_megatron.families.FAMILIES`)."""
    vocab_file: Path
    """WordPiece ``vocab.txt``, byte-level BPE ``vocab.json`` (``merges.txt`` beside it) or ``spiece.model``."""
    vocab_size: int
    lowercase: bool | None = None
    task: str | None = None
    """None for a pretraining model; ``ner`` / ``re`` / ``qa`` / ``classify`` for a fine-tuned one."""
    labels: list[str] | None = None
    head: dict[str, torch.Tensor] = field(default_factory=dict)
    """A fine-tuned model's ``head.*`` tensors (empty for a pretraining model)."""
    head_settings: dict = field(default_factory=dict)
    """``num_fc_layers`` / ``num_output_layers`` / ``fc_dropout`` / ``activation`` / ``use_transformer_init``."""
    source: str = ""
    """Where it was read from (for messages and the written metadata)."""
    origin: dict = field(default_factory=dict)
    """What a foreign source records about itself, written as it is into an imported checkpoint's
    ``bio_megatron.json`` (``{"megatron_lm": {...}}``, ``{"nemo": {...}}``)."""

    @property
    def shape(self) -> ModelShape:
        return self.model.shape()

    @property
    def binary_head(self) -> bool:
        """Trained with a next-sentence / sentence-order head (and its weights are here)."""
        return "binary_head.weight" in self.tensors

    @property
    def vocab_text(self) -> str:
        return Path(self.vocab_file).read_text(encoding="utf-8")

    def tokenizer(self):
        """The tokenizer of :attr:`vocab_file` with the recorded casing (WordPiece, byte-level BPE, SentencePiece)."""
        from bio_megatron.vocab.bpe import load_tokenizer

        return load_tokenizer(self.vocab_file, self.lowercase)


def unpadded(tensors: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """``tensors`` with the vocabulary tables cut to their ``vocab_size`` real rows."""
    return {k: (v[:vocab_size] if k.endswith(VOCAB_ROWS) else v) for k, v in tensors.items()}


__all__ = ["VOCAB_ROWS", "ModelState", "unpadded"]
