"""Our own checkpoints (any saved TP/PP layout) read at TP1: :func:`read_ours` is the one reader of a checkpoint
(pretraining or fine-tuned) into the formats' :class:`~bio_megatron.formats.state.ModelState`, which ``export hf``,
``export megatron-lm`` and ``export nemo`` write from; :func:`read_pretraining` gives the runnable pretraining model
that every ``import ... --verify`` runs.

A fine-tuned model's encoder + head load through :func:`bio_megatron.loading.finetuned.load_finetuned`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import family_of_model
from bio_megatron.formats.saved import saved_model_config
from bio_megatron.formats.state import ModelState, unpadded
from bio_megatron.loading.source import Source, resolve_source
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


# The head settings a fine-tuned model section holds (NER/QA: ``head``, RE/classify: ``classifier_head``).
_HEAD_KEYS = ("num_fc_layers", "num_output_layers", "fc_dropout", "activation", "use_transformer_init")


def read_ours(checkpoint: str | Path, default_labels: Sequence[str] | None = None,
              accept: Callable[[Source], None] | None = None) -> ModelState:
    """Our checkpoint ``checkpoint`` (pretraining or fine-tuned; directory, its checkpoints folder or run dir; any
    saved layout) as a :class:`ModelState`, resharded into this one-process TP1 world. ``default_labels``: as
    :func:`~bio_megatron.loading.finetuned.load_finetuned` (a classify model without ``label_ids.csv``).
    ``accept(src)``: a writer's refusal (CheckpointError) of what it cannot hold, run before any weight is read.
    CheckpointError for anything that is not a checkpoint of ours, before a process group exists."""
    from bio_megatron.loading.finetuned import load_finetuned, single_process
    from bio_megatron.models.hf_convert import normalise

    src = resolve_source(checkpoint)
    if src.kind != "checkpoint":
        raise CheckpointError(f"{checkpoint}: a Hugging Face folder, not a checkpoint of ours; import it first "
                              "(bio-megatron import hf)")
    if accept is not None:
        accept(src)
    single_process()
    head: dict[str, torch.Tensor] = {}
    settings: dict = {}
    if src.task is None:
        model, m, tok = read_pretraining(src)
        tensors, labels = normalise(model.state_dict()), None
    else:
        loaded = load_finetuned(src.path, default_labels=default_labels)
        m, tok, labels = loaded.cfg.model, loaded.tokenizer, loaded.labels
        full = normalise(loaded.model.state_dict())
        head = {k: v for k, v in full.items() if k.startswith("head.")}
        tensors = {k: v for k, v in full.items() if not k.startswith("head.")}
        h = m.classifier_head if hasattr(m, "classifier_head") else m.head
        settings = {k: getattr(h, k) for k in _HEAD_KEYS if hasattr(h, k)}
    return ModelState(unpadded(tensors, tok.vocab_size), m, family_of_model(m).name, Path(src.vocab_file),
                      tok.vocab_size, getattr(tok, "lowercase", None), src.task, labels, head, settings,
                      str(src.path))
