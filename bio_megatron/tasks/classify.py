"""BLURB sentence(-pair) classification, regression and multi-label classification (``finetune classify``).

NeMo's ``text_classification`` model: the [CLS] hidden state -> dropout -> an MLP of
``model.classifier_head.num_output_layers`` Linear layers (:class:`~bio_megatron.models.heads.SequenceClassifier`,
the head RE uses too). The dataset (``model.dataset.task_name``, :mod:`bio_megatron.tasks.classify_data`) picks
the output layer and loss:

* ``single`` (PubMedQA, BioASQ yes/no, DDI, GAD): one logit per class, softmax cross entropy (optionally
  NeMo's ``class_balancing: weighted_loss``), prediction = argmax;
* ``regression`` (BIOSSES): one output, mean squared error against the gold score, prediction = the output;
* ``multi`` (HoC): one logit per hallmark, sigmoid + binary cross entropy per label (``class_balancing:
  weighted_loss``: each label's positive term weighted by its negatives / positives in the training split,
  torch's ``pos_weight``), a label is predicted when its probability exceeds 0.5 (logit > 0). Training and
  prediction are per sentence, as BLURB's; the metric ORs a sentence's labels into its abstract.

Scores are the ``evaluate <task_name>`` JSON (``metric``, ``score`` on BLURB's 0-1 scale, details); the best
checkpoint is chosen on the dev ``score``, and the test predictions are written in the JSON-lines format
``bio-megatron evaluate <task_name> --pred`` reads, so that the command reproduces the reported test score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bio_megatron.evaluation.blurb import as_dict
from bio_megatron.models.heads import SequenceClassifier, build_head
from bio_megatron.tasks.classify_data import ClassifyExample, dataset, encode
from bio_megatron.tasks.subset import take
from bio_megatron.utils.errors import ConfigError, DataError
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


@dataclass
class ClassifySplit:
    examples: list[ClassifyExample]
    features: list[tuple[list[int], list[int]]]  # (input ids, token types), special tokens included


def same_head(cfg, restored_labels: list[str] | None) -> bool:
    """A restored ``classify`` checkpoint keeps its head only when it was trained on this label set (PubMedQA's
    yes/no/maybe head cannot serve BioASQ's yes/no): otherwise its encoder is used with a fresh head."""
    return list(restored_labels or []) == list(dataset(cfg.model.dataset.task_name).labels)


class ClassifyTask:
    """Everything the shared fine-tuning loop needs for one BLURB classification dataset
    (:class:`~bio_megatron.tasks.protocol.Task`)."""

    name = "classify"
    metric = "score"  # BLURB's headline metric of the dataset, on the 0-1 scale (as `evaluate` prints it)

    def __init__(self, cfg, tokenizer, labels: list[str] | None = None):
        self.d = cfg.model.dataset
        self.data = dataset(self.d.task_name)
        self.mode = self.data.mode
        if labels is not None and list(labels) != list(self.data.labels):
            raise ConfigError(f"the restored model predicts {labels}, but model.dataset.task_name "
                              f"{self.d.task_name!r} has the labels {list(self.data.labels)}")
        self.labels = list(self.data.labels)
        self.tokenizer = tokenizer
        self.train = self._encode(self._take(self._read(self.d.train_file), self.d.max_train_examples))
        self.weights = None  # single: cross-entropy class weights; multi: BCE pos_weight per label
        if self.d.class_balancing == "weighted_loss":
            self.weights = self._balancing_weights(self.train.examples)
            log.info("%s: class_balancing weighted_loss (%s): %s", self.d.task_name,
                     "per-class cross-entropy weights" if self.mode == "single" else "BCE pos_weight = neg / pos",
                     ", ".join(f"{name} {w:.3g}" for name, w in zip(self.labels, self.weights.tolist())))
        self.splits = {"train": self.train}
        summary = self._label_counts(self.train.examples)
        log.info("%s: %d training examples%s", self.d.task_name, len(self.train.examples),
                 f" ({summary})" if summary else "")

    def _balancing_weights(self, examples: list[ClassifyExample]) -> torch.Tensor:
        """``class_balancing: weighted_loss`` from the training split. Single-label: NeMo's total / (n_classes x
        count), 0 for absent classes. Multi-label: negatives / positives per label, so that a rare label's few
        positives pull as hard as its many negatives push (without it HoC's [CLS] states collapse onto the label
        frequencies, docs/FINETUNE.md); a label with no positive gets 1 (nothing to weight)."""
        n = len(self.labels)
        if self.mode == "single":
            counts = torch.bincount(torch.tensor([e.target for e in examples]), minlength=n).float()
            return torch.where(counts > 0, counts.sum() / (n * counts.clamp(min=1)), 0.0)
        pos = torch.zeros(n)
        for e in examples:
            pos[list(e.target)] += 1
        neg = len(examples) - pos
        return torch.where(pos > 0, neg / pos.clamp(min=1), 1.0)

    def _take(self, examples: list[ClassifyExample], n: int | None) -> list[ClassifyExample]:
        """max_*_examples: stratified by label where a label is one class (not scores, not label sets)."""
        return take(examples, n, self.d.max_examples_seed, (lambda e: e.target) if self.mode == "single" else None)

    def _read(self, file: str) -> list[ClassifyExample]:
        return self.data.examples(Path(self.d.data_dir) / file, **self.data.reader_options(self.d))

    def _encode(self, examples: list[ClassifyExample]) -> ClassifySplit:
        return ClassifySplit(examples, encode(examples, self.tokenizer, self.d.max_seq_length))

    def _label_counts(self, examples: list[ClassifyExample]) -> str:
        if self.mode == "regression":
            return ""
        counts = [0] * len(self.labels)
        for e in examples:
            for t in ([e.target] if self.mode == "single" else e.target):
                counts[t] += 1
        return ", ".join(f"{name} {n}" for name, n in zip(self.labels, counts))

    def split(self, name: str) -> ClassifySplit | None:
        if name not in self.splits:
            file = {"dev": self.d.dev_file, "test": self.d.test_file}[name]
            if not file:
                return None
            self.splits[name] = self._encode(self._take(self._read(file), self.d.max_eval_examples))
        return self.splits[name]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def build_head(self, model_cfg) -> SequenceClassifier:
        """NeMo's SequenceClassifier from ``model.classifier_head`` and ``model.fc_hidden_size``."""
        return build_head(self.name, model_cfg, model_cfg.shape().hidden_size, self.num_classes)

    def length(self, split: ClassifySplit, i: int) -> int:
        return len(split.features[i][0])

    def collate(self, split: ClassifySplit, indices: list[int], seq_len: int) -> dict[str, torch.Tensor]:
        ids = torch.full((len(indices), seq_len), self.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, i in enumerate(indices):  # index -1: padding rows of the last eval group, dropped later
            f_ids, f_types = split.features[max(i, 0)]
            ids[r, :len(f_ids)] = torch.tensor(f_ids)
            types[r, :len(f_ids)] = torch.tensor(f_types)
            mask[r, :len(f_ids)] = 1
        targets = [split.examples[max(i, 0)].target for i in indices]
        if self.mode == "single":
            label = torch.tensor(targets, dtype=torch.long)
        elif self.mode == "regression":
            label = torch.tensor(targets, dtype=torch.float32)
        else:
            label = torch.zeros(len(indices), len(self.labels))
            for r, t in enumerate(targets):
                label[r, list(t)] = 1.0
        return {"input_ids": ids, "attention_mask": mask, "tokentype_ids": types, "label": label,
                "index": torch.tensor(indices)}

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        logits = logits.float()
        if self.mode == "single":
            w = self.weights.to(logits.device) if self.weights is not None else None
            return F.cross_entropy(logits, batch["label"], weight=w)
        if self.mode == "regression":
            return F.mse_loss(logits[:, 0], batch["label"])
        w = self.weights.to(logits.device) if self.weights is not None else None
        return F.binary_cross_entropy_with_logits(logits, batch["label"], pos_weight=w)  # mean over examples x labels

    def outputs(self, logits: torch.Tensor, batch: dict) -> list:
        return self.outputs_of(self.mode, logits)

    @staticmethod
    def outputs_of(mode: str, logits: torch.Tensor) -> list:
        """Per-example predictions: a label id (argmax), a score, or the label indices whose sigmoid > 0.5."""
        if mode == "single":
            return logits.argmax(-1).tolist()
        if mode == "regression":
            return logits[:, 0].tolist()
        return [[j for j, on in enumerate(row) if on] for row in (logits > 0).tolist()]

    @staticmethod
    def decode(dataset_cfg, logits: torch.Tensor, attention_mask: torch.Tensor) -> list:
        """:meth:`outputs_of` for the mode of ``dataset_cfg.task_name`` (what ``predict classify`` runs)."""
        return ClassifyTask.outputs_of(dataset(dataset_cfg.task_name).mode, logits)

    def score(self, split: ClassifySplit, outputs: list) -> dict:
        """``evaluate <task_name>``'s JSON for these predictions (``score``: the headline, 0-1 scale)."""
        if self.mode == "regression" and len(set(outputs)) == 1:
            # Pearson's r is undefined for a constant prediction: no correlation is what it shows for selection.
            log.warning("%s: every predicted score is %g; Pearson's r is undefined, counted as 0 here",
                        self.d.task_name, outputs[0])
            return {"task": self.d.task_name, "metric": "pearson", "score": 0.0, "pearson": 0.0,
                    "pairs": len(outputs), "constant_prediction": True}
        return as_dict(self.data.score(split.examples, outputs), self.d.task_name)

    def write_predictions(self, split: ClassifySplit, outputs: list, path: Path) -> Path:
        """JSON lines for ``bio-megatron evaluate <task_name> --gold <file> --pred <path>``."""
        if len(outputs) != len(split.examples):
            raise DataError(f"{len(outputs)} predictions for {len(split.examples)} examples", str(path))
        with atomic_open(path, "w", encoding="utf-8") as fh:
            for e, o in zip(split.examples, outputs):
                fh.write(json.dumps(self.data.prediction(e.id, o)) + "\n")
        return path
