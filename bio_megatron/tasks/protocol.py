"""The interface every fine-tuning task implements, and the registry ``finetune`` picks a task from.

A task is everything task-specific around one encoder: its data reader (splits of features, their lengths,
collation into batches), its head, loss, decoding of logits into per-example predictions, metric and
prediction files. :mod:`bio_megatron.tasks.finetune` runs any of them through the same loop, typed against
:class:`Task`; ``predict`` reuses a task's :meth:`Task.decode` on new input (no task data is read there, so
it is a static method taking the checkpoint's ``model.dataset`` config).

Tasks implement the protocol structurally (no base class): ``tests/tasks/test_protocol.py`` checks every
registered task against it, members and signatures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from bio_megatron.tasks.classify import ClassifyTask
from bio_megatron.tasks.ner import NerTask
from bio_megatron.tasks.qa import QaTask
from bio_megatron.tasks.re import ReTask


@runtime_checkable
class Split(Protocol):
    """One split of a task's data: ``features`` (model inputs, one per example or per window of one) beside
    the task's own records (``examples`` / ``sentences``) that scoring and prediction files read."""

    features: Sequence[Any]


@runtime_checkable
class Task(Protocol):
    """What the fine-tuning loop, checkpoint selection and ``predict`` need of a task."""

    name: str               # the ``finetune <task>`` name, the registry key and the checkpoint's ``task``
    metric: str             # key of :meth:`score`'s dict that picks the best checkpoint on dev (higher is better)
    labels: list[str] | None  # label names by class id, saved as ``label_ids.csv``; None when the head has none
    train: Split            # the training split, read (and validated) when the task is built

    # --- data reader -----------------------------------------------------------------------------------
    def split(self, name: str) -> Split | None:
        """The ``dev`` or ``test`` split, read on first use and cached; None when its file is not configured."""
        ...

    def length(self, split: Split, i: int) -> int:
        """Token length of ``split.features[i]`` (the loop pads each micro-batch to its longest, rounded up)."""
        ...

    def collate(self, split: Split, indices: list[int], seq_len: int) -> dict[str, torch.Tensor]:
        """A batch of ``split.features[indices]`` padded to ``seq_len``: ``input_ids``, ``attention_mask``,
        ``tokentype_ids`` ``[b, seq_len]``, ``index`` ``[b]`` and the targets :meth:`loss` reads. Index -1 marks
        a padding row of the last evaluation group (filled from example 0, dropped from the outputs)."""
        ...

    # --- head ------------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Width of the head's output per position (NER), per sequence (RE, classify) or 2 (QA start/end)."""
        ...

    def build_head(self, model_cfg: Any) -> nn.Module:
        """A fresh head for ``model_cfg`` (``model.head`` / ``model.classifier_head``, ``fc_hidden_size``) over
        the encoder's hidden size: :func:`bio_megatron.models.heads.build_head` for this task's name."""
        ...

    # --- loss ------------------------------------------------------------------------------------------
    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """Scalar training loss of the head's ``logits`` against the targets :meth:`collate` put in ``batch``."""
        ...

    # --- decode ----------------------------------------------------------------------------------------
    def outputs(self, logits: torch.Tensor, batch: dict) -> list:
        """Per-example predictions of one batch (plain Python values, gathered across ranks), in batch order:
        :meth:`decode` with this task's dataset config."""
        ...

    @staticmethod
    def decode(dataset_cfg: Any, logits: torch.Tensor, attention_mask: torch.Tensor) -> list:
        """Per-example predictions from ``logits`` ``[b, ...]`` of a batch with ``attention_mask`` ``[b, s]``,
        given only the ``model.dataset`` config: the hook ``predict`` runs on new input, without task data."""
        ...

    # --- metric ----------------------------------------------------------------------------------------
    def score(self, split: Split, outputs: list) -> dict:
        """The task's official-equivalent scores of ``outputs`` (one per feature of ``split``, in order);
        includes :attr:`metric`."""
        ...

    # --- predict ---------------------------------------------------------------------------------------
    def write_predictions(self, split: Split, outputs: list, path: Path) -> Path | None:
        """Write ``outputs`` of the test ``split`` in the format ``bio-megatron evaluate`` reads, at or beside
        ``path`` (atomically); returns the file written, or None for a task that writes none."""
        ...


# ``finetune <task>``: the task built from (config, tokenizer, a restored model's labels or None).
TaskFactory = Callable[[Any, Any, "list[str] | None"], Task]
TASKS: dict[str, TaskFactory] = {"ner": NerTask, "re": ReTask, "qa": QaTask, "classify": ClassifyTask}
