"""NER fine-tuning: IOB/NeMo data -> sub-token features -> token-classifier loss -> conlleval entity F1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bio_megatron.evaluation.conlleval import evaluate_sequences
from bio_megatron.models.heads import build_head, token_loss
from bio_megatron.tasks.ner_data import (IGNORE_INDEX, NerFeature, Sentence, build_label_map, class_weights,
                                         encode_sentences, read_iob, read_nemo, word_predictions)
from bio_megatron.tasks.subset import take
from bio_megatron.utils.errors import DataError

SPAN_FORMATS = ("i2b2_2010", "i2b2_2012", "i2b2_2014", "share_clefe")  # releases of annotated spans, labelled B-/I-<type> here


def read_split(d, name: str | None, labels: list[str] | None = None) -> list[Sentence]:
    """One split in the configured format (``iob`` file or NeMo ``text_*.txt`` + ``labels_*.txt``)."""
    path = Path(d.data_dir) / name
    if d.format == "nemo":
        labels_path = path.with_name(path.name.replace("text_", "labels_", 1))
        if labels_path == path:
            raise DataError("NeMo NER files must be named text_<split>.txt (labels in labels_<split>.txt)", str(path))
        return read_nemo(path, labels_path, labels)
    if d.format == "blue":
        from bio_megatron.tasks.blue_ner import read_blue_ner  # BLUE's 4-column files (bio-lm's BC5CDR)

        return read_blue_ner(path, labels)
    if d.format == "i2b2_2010":  # the release's txt/ + concept/ folders; name: a folder or train/dev/test
        from bio_megatron.tasks.i2b2 import read_i2b2_2010

        return read_i2b2_2010(d.data_dir, name, labels)
    if d.format in ("i2b2_2012", "i2b2_2014"):  # XML with character offsets
        from bio_megatron.tasks.i2b2_xml import read_i2b2_xml

        return read_i2b2_xml(d.format, d.data_dir, name, labels)
    if d.format == "share_clefe":  # reports + pipe files, discontiguous mentions as BLUE tags them
        from bio_megatron.tasks.share_clefe import read_share_clefe

        return read_share_clefe(d.data_dir, name, labels)
    return read_iob(path, labels)


@dataclass
class NerSplit:
    sentences: list[Sentence]
    features: list[NerFeature]


class NerTask:
    """Everything NER-specific the shared fine-tuning loop needs (:class:`~bio_megatron.tasks.protocol.Task`)."""

    name = "ner"
    metric = "f1"

    def __init__(self, cfg, tokenizer, labels: list[str] | None = None):
        self.d = cfg.model.dataset
        self.tokenizer = tokenizer
        train = take(read_split(self.d, self.d.train_file), self.d.max_train_examples, self.d.max_examples_seed)
        if labels is None:
            # the span formats tag a type B-/I- by construction: both are labels even where training shows only B-
            types = {t[1:] for s in train for t in s.tags if t[:1] in ("B", "I")}  # "-<type>", or "" (untyped)
            both = [Sentence([], [p + t for t in types for p in "BI"])] if self.d.format in SPAN_FORMATS else []
            label_map = build_label_map(train + both, self.d.pad_label, self.d.continuation_label == "inside")
        else:
            if labels[0] != self.d.pad_label:
                raise DataError(f"the restored model's label 0 is {labels[0]!r}, but pad_label is {self.d.pad_label!r}")
            label_map = {t: i for i, t in enumerate(labels)}
        self.labels = sorted(label_map, key=label_map.get)
        self.label_map = label_map
        self.weights = (torch.tensor(class_weights(train, label_map), dtype=torch.float32)
                        if self.d.class_balancing == "weighted_loss" else None)
        self.train = self._encode(train)
        self.splits = {"train": self.train}

    def _encode(self, sentences: list[Sentence]) -> NerSplit:
        return NerSplit(sentences, encode_sentences(sentences, self.tokenizer, self.label_map, self.d.max_seq_length,
                                                    self.d.ignore_extra_tokens, self.d.ignore_start_end,
                                                    self.d.continuation_label))

    def split(self, name: str) -> NerSplit | None:
        """dev/test split, read on first use (tags must be in the training label map)."""
        if name not in self.splits:
            file = {"dev": self.d.dev_file, "test": self.d.test_file}[name]
            if not file:
                return None
            sents = take(read_split(self.d, file, self.labels), self.d.max_eval_examples, self.d.max_examples_seed)
            self.splits[name] = self._encode(sents)
        return self.splits[name]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def build_head(self, model_cfg) -> nn.Module:
        return build_head(self.name, model_cfg, model_cfg.shape().hidden_size, self.num_classes)

    def length(self, split: NerSplit, i: int) -> int:
        return len(split.features[i].input_ids)

    def collate(self, split: NerSplit, indices: list[int], seq_len: int) -> dict[str, torch.Tensor]:
        n = len(indices)
        ids = torch.full((n, seq_len), self.tokenizer.pad, dtype=torch.long)  # RoBERTa's <pad> is 1, BERT's 0
        labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros(n, seq_len, dtype=torch.long)
        for r, i in enumerate(indices):
            f = split.features[max(i, 0)]
            L = len(f.input_ids)
            ids[r, :L] = torch.tensor(f.input_ids)
            labels[r, :L] = torch.tensor(f.labels)
            mask[r, :L] = 1
        return {"input_ids": ids, "attention_mask": mask, "tokentype_ids": torch.zeros_like(ids),
                "labels": labels, "index": torch.tensor(indices)}

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        w = self.weights.to(logits.device) if self.weights is not None else None
        return token_loss(logits, batch["labels"], w)

    def outputs(self, logits: torch.Tensor, batch: dict) -> list:
        return self.decode(self.d, logits, batch["attention_mask"])

    @staticmethod
    def decode(dataset_cfg, logits: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """Per-example argmax label ids over the real (unpadded) positions."""
        pred = logits.argmax(-1).cpu()
        lens = attention_mask.sum(-1).tolist()
        return [pred[r, :L].tolist() for r, L in enumerate(lens)]

    def word_tags(self, split: NerSplit, outputs: list) -> list[list[str]]:
        return [[self.labels[t] for t in word_predictions(o, f)] for o, f in zip(outputs, split.features)]

    def write_predictions(self, split: NerSplit, outputs: list, path: Path) -> Path:
        """Test predictions as conlleval columns ``word gold predicted`` (a blank line between sentences), the
        input of ``bio-megatron evaluate ner|jnlpba|ebm_pico``; written beside ``path`` as ``.conll``, atomically."""
        from bio_megatron.utils.io import atomic_open

        out = Path(path).with_suffix(".conll")
        with atomic_open(out, encoding="utf-8") as fh:
            for sent, tags in zip(split.sentences, self.word_tags(split, outputs)):
                fh.write("".join(f"{w} {g} {t}\n" for w, g, t in zip(sent.words, sent.tags, tags)) + "\n")
        return out

    def score(self, split: NerSplit, outputs: list) -> dict:
        """conlleval's entity-level precision/recall/F1 (percent) over per-word predictions."""
        return evaluate_sequences([s.tags for s in split.sentences], self.word_tags(split, outputs))
