"""A fine-tuned model (our checkpoint at any saved TP/PP layout, or an HF task folder) loaded into one process at TP1,
for inference (``predict``), export and import checks: the one loader every task's model goes through. The task
model is built by its family (:mod:`bio_megatron.families.task`) and filled by
:func:`bio_megatron.formats.fill.load_into`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from bio_megatron.config.finetune import CONFIG_CLASSES
from bio_megatron.config.loader import from_dict
from bio_megatron.formats.saved import saved_config
from bio_megatron.formats.source import Source, resolve_source, task_config_for_hf
from bio_megatron.families.task import TaskModel, build_task_model, init_task_model
from bio_megatron.formats.fill import load_into
from bio_megatron.models.heads import build_head
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.wordpiece import RustBackedTokenizer


@dataclass
class Loaded:
    model: TaskModel
    cfg: object           # the task config saved with the checkpoint
    tokenizer: RustBackedTokenizer  # WordPiece, or byte-level BPE (RoBERTa): what fine-tuning used
    labels: list[str] | None
    source: Source

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def task_config_of(src: Source):
    """The fine-tuning config saved beside a checkpoint (or built for an imported HF folder)."""
    if src.task is None:
        raise CheckpointError(f"{src.path}: a pretraining checkpoint has no task head; fine-tune it first "
                              "(bio-megatron finetune ...) or export it as MegatronBertForMaskedLM")
    if src.kind == "hf":
        return task_config_for_hf(src)
    raw = saved_config(src.path)
    return from_dict(CONFIG_CLASSES[src.task], raw)


def finetuned_source(path: str | Path, task: str | None = None) -> tuple[Source, object]:
    """The source and saved task config of a fine-tuned model (no weights read); ``task``: refuse a model
    fine-tuned for another task (CheckpointError naming both)."""
    src = resolve_source(path)
    cfg = task_config_of(src)
    if task is not None and src.task != task:
        raise CheckpointError(f"{path}: a {src.task} model, not {task}")
    return src, cfg


def load_finetuned(path: str | Path, task: str | None = None,
                   default_labels: Sequence[str] | None = None) -> Loaded:
    """Encoder + head of a fine-tuned checkpoint or HF task folder, in eval mode, in this (TP1) process.
    ``task``: as :func:`finetuned_source`. ``default_labels``: the label set when the source names none (a
    classify checkpoint without ``label_ids.csv``: its dataset's labels, which the caller knows)."""
    src, cfg = finetuned_source(path, task)
    m = cfg.model
    for k, v in src.shape.items():
        setattr(m, k, v)
    m.tensor_model_parallel_size = m.pipeline_model_parallel_size = 1
    if src.vocab_file is None:
        raise CheckpointError(f"{src.path}: no vocabulary beside the weights (vocab.txt, or vocab.json + "
                              "merges.txt)")
    tokenizer = load_tokenizer(src.vocab_file, m.tokenizer.do_lower_case)
    labels = src.labels or (list(default_labels) if default_labels is not None else None)
    num_classes = len(labels) if labels else 2
    head = build_head(src.task, m, m.shape().hidden_size, num_classes)
    padded = src.padded_vocab or tokenizer.vocab_size
    model = build_task_model(m, padded, head, torch.float32, seed=0, pre_process=True, post_process=True,
                             initialise=False)
    init_task_model(model, m, 0, load_into(model, src, encoder_only=False))  # whatever the source did not hold
    return Loaded(model.eval(), cfg, tokenizer, labels, src)
