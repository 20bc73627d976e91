"""Our own checkpoints (any saved TP/PP layout) read at TP1: the one loader of a pretraining model that
``export hf``, ``export megatron-lm`` / ``export nemo`` and ``import ... --verify`` share.

Fine-tuned models load through :func:`bio_megatron.loading.finetuned.load_finetuned` (encoder + head at any
layout).
"""

from __future__ import annotations

import torch

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import family_of_model
from bio_megatron.formats.saved import saved_model_config
from bio_megatron.loading.source import Source
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.vocab.bpe import load_tokenizer


def pretraining_config(src: Source) -> tuple[ModelConfig, dict]:
    """(ModelConfig, saved ``model`` section) of a pretraining checkpoint ``src``: its saved shape and family and
    binary head; dropout off and the local transformer, as every reader at TP1 builds it. No weights are read."""
    if src.kind != "checkpoint":
        raise CheckpointError(f"{src.path}: a Hugging Face folder, not a checkpoint of ours")
    raw = saved_model_config(src.path)
    m = ModelConfig(**src.shape, bert_binary_head=bool(raw.get("bert_binary_head", False)), hidden_dropout=0.0,
                    attention_dropout=0.0, transformer_impl="local")
    return m, raw


def load_pretraining_model(src: Source, m: ModelConfig, vocab_size: int) -> torch.nn.Module:
    """The family's pretraining model of ``m`` filled from checkpoint ``src`` (resharded to this TP1 process), in
    eval mode. The embedding is rebuilt exactly as saved (its padding depends on the saved TP size)."""
    from bio_megatron.training.checkpoint import load_checkpoint

    divisible = m.make_vocab_size_divisible_by
    if src.padded_vocab:
        m.make_vocab_size_divisible_by = int(src.padded_vocab)
    model = family_of_model(m).build_pretraining_model(m, vocab_size, torch.float32).eval()
    load_checkpoint(src.path, model, model_only=True)
    m.make_vocab_size_divisible_by = divisible  # the config as saved: writers pad for their own layout
    return model


def tokenizer_of(src: Source, raw: dict):
    """The tokenizer saved beside checkpoint ``src`` (WordPiece, byte-level BPE or SentencePiece), with the
    casing its config (``raw``: the model section) recorded."""
    return load_tokenizer(src.vocab_file, (raw.get("tokenizer") or {}).get("do_lower_case"))


def read_pretraining(src: Source) -> tuple[torch.nn.Module, ModelConfig, object]:
    """A pretraining checkpoint at TP1 in eval mode: (model, ModelConfig, tokenizer)."""
    m, raw = pretraining_config(src)
    tok = tokenizer_of(src, raw)
    return load_pretraining_model(src, m, tok.vocab_size), m, tok
