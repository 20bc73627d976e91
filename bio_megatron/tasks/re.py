"""Relation extraction (ChemProt) fine-tuning: sentence -> [CLS] classifier -> micro-F1 over CPR:3/4/5/6/9."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bio_megatron.evaluation.chemprot import CHEMPROT_LABELS, POSITIVE_LABELS, chemprot_scores
from bio_megatron.models.heads import build_head
from bio_megatron.tasks.re_data import RelationExample, read_relations
from bio_megatron.tasks.subset import take
from bio_megatron.utils.errors import DataError


def read_split(d, name: str) -> list[RelationExample]:
    if d.format == "i2b2_2010":  # BLUE's i2b2 2010 relation TSV (its own labels and positives)
        from bio_megatron.tasks.i2b2_relations import read_i2b2_relations

        return read_i2b2_relations(Path(d.data_dir) / name)
    return read_relations(Path(d.data_dir) / name, d.format)


def label_set(fmt: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(labels, the positives scored) of a relation format: ChemProt's, or i2b2 2010's."""
    if fmt == "i2b2_2010":
        from bio_megatron.tasks.i2b2_relations import I2B2_RE_LABELS, I2B2_RE_POSITIVES

        return I2B2_RE_LABELS, I2B2_RE_POSITIVES
    return CHEMPROT_LABELS, POSITIVE_LABELS


@dataclass
class ReSplit:
    examples: list[RelationExample]
    features: list[list[int]]   # [CLS] sentence [SEP] ids (<s> sentence </s> for RoBERTa)
    label_ids: list[int]


class ReTask:
    """ChemProt as NeMo's text classification: the label set is ``false, CPR:3, CPR:4, CPR:5, CPR:6, CPR:9``
    (:class:`~bio_megatron.tasks.protocol.Task`)."""

    name = "re"
    metric = "f1"

    def __init__(self, cfg, tokenizer, labels: list[str] | None = None):
        self.d = cfg.model.dataset
        self.tokenizer = tokenizer
        self.labels = list(labels or label_set(self.d.format)[0])
        self.label_map = {t: i for i, t in enumerate(self.labels)}
        self.train = self._encode(take(read_split(self.d, self.d.train_file), self.d.max_train_examples,
                                        self.d.max_examples_seed, lambda e: e.label), "train")
        self.weights = None
        if self.d.class_balancing == "weighted_loss":  # NeMo: total / (n_classes * count), 0 for absent classes
            counts = torch.bincount(torch.tensor(self.train.label_ids), minlength=len(self.labels)).float()
            self.weights = torch.where(counts > 0, counts.sum() / (len(self.labels) * counts.clamp(min=1)), 0.0)
        self.splits = {"train": self.train}

    def _encode(self, examples: list[RelationExample], split: str) -> ReSplit:
        for ex in examples:
            if ex.label not in self.label_map:
                raise DataError(f"{split}: label {ex.label!r} of {ex.source} is not one of {self.labels}")
        ids = self.tokenizer.tokenize_batch([e.sentence for e in examples])  # raw text, as RobertaTokenizerFast too
        n = self.d.max_seq_length - 2
        feats = [self.tokenizer.single(i[:n]) for i in ids]
        return ReSplit(examples, feats, [self.label_map[e.label] for e in examples])

    def split(self, name: str) -> ReSplit | None:
        if name not in self.splits:
            file = {"dev": self.d.dev_file, "test": self.d.test_file}[name]
            if not file:
                return None
            self.splits[name] = self._encode(take(read_split(self.d, file), self.d.max_eval_examples,
                                                  self.d.max_examples_seed, lambda e: e.label), name)
        return self.splits[name]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def build_head(self, model_cfg) -> nn.Module:
        return build_head(self.name, model_cfg, model_cfg.shape().hidden_size, self.num_classes)

    def length(self, split: ReSplit, i: int) -> int:
        return len(split.features[i])

    def collate(self, split: ReSplit, indices: list[int], seq_len: int) -> dict[str, torch.Tensor]:
        ids = torch.full((len(indices), seq_len), self.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1
        mask = torch.zeros_like(ids)
        for r, i in enumerate(indices):
            f = split.features[max(i, 0)]
            ids[r, :len(f)] = torch.tensor(f)
            mask[r, :len(f)] = 1
        labels = torch.tensor([split.label_ids[max(i, 0)] for i in indices])
        return {"input_ids": ids, "attention_mask": mask, "tokentype_ids": torch.zeros_like(ids), "label": labels,
                "index": torch.tensor(indices)}

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        w = self.weights.to(logits.device) if self.weights is not None else None
        return F.cross_entropy(logits.float(), batch["label"], weight=w)

    def outputs(self, logits: torch.Tensor, batch: dict) -> list:
        return self.decode(self.d, logits, batch["attention_mask"])

    @staticmethod
    def decode(dataset_cfg, logits: torch.Tensor, attention_mask: torch.Tensor) -> list[int]:
        """Per-example argmax label ids."""
        return logits.argmax(-1).tolist()

    def score(self, split: ReSplit, outputs: list) -> dict:
        """Micro precision/recall/F1 over the positive classes (fractions), negatives excluded."""
        return chemprot_scores([e.label for e in split.examples], [self.labels[o] for o in outputs],
                               label_set(self.d.format)[1])

    def write_predictions(self, split: ReSplit, outputs: list, path: Path) -> Path | None:
        """None: RE writes no prediction file (its test scores are computed in-process, in results.json)."""
        return None
