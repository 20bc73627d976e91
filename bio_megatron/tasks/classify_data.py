"""The BLURB datasets the ``classify`` task trains on: reader, head mode, label set and official metric of each.

One table (:data:`DATASETS`, keyed by ``model.dataset.task_name``) says everything that differs between them:

==============  =====================  ==========  ==========================================================
task_name       input                  mode        metric (:mod:`bio_megatron.evaluation.blurb`)
==============  =====================  ==========  ==========================================================
pubmedqa        question, contexts (*) single      accuracy over yes/no/maybe
bioasq_yesno    question, snippets     single      accuracy over yes/no
ddi             sentence               single      micro-F1 over the 4 positive classes (DDI-false negative)
gad             sentence               single      F1 of the positive class 1
biosses         sentence pair          regression  Pearson's r
hoc             sentence               multi       abstract-level micro-F1 (sentence predictions OR-ed)
mednli          premise, hypothesis    single      accuracy over entailment/neutral/contradiction
clinicalsts     sentence pair          regression  Pearson's r (similarity 0-5)
==============  =====================  ==========  ==========================================================

(*) or, with ``model.dataset.pubmedqa_long_answer: true``, question + the abstract's conclusion (PubMedQA's
reasoning-free setting; BLURB's is reasoning-required, the default).

Every example becomes a :class:`ClassifyExample` (id, text, optional second text, target). Encoding is
BERT's: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with token types 0/1 (``tokenizer.single`` /
``tokenizer.pair``; RoBERTa's forms for a BPE vocabulary); a pair too long for ``max_seq_length`` is cut as
transformers' fast tokenizers cut it (``truncation="longest_first"``, what BLURB's baselines ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

from bio_megatron.evaluation.blurb import (BIOASQ_YESNO_LABELS, DDI_LABELS, DDI_POSITIVES, GAD_LABELS, GAD_POSITIVE,
                                           HOC_LABELS, PUBMEDQA_LABELS, BlurbResult, accuracy_scores, hoc_scores,
                                           pearson_scores, positive_f1_scores)
from bio_megatron.tasks import blurb_data, clinical_data, folds
from bio_megatron.utils.errors import DataError

Mode = Literal["single", "regression", "multi"]
Target = int | float | frozenset  # label id / similarity score / label indices
REGRESSION_LABELS: tuple[str, ...] = ("score",)  # one output; saved as the label map so the head has 1 output


@dataclass(frozen=True)
class ClassifyExample:
    """One input: ``text`` (and ``text_b`` for a pair) with its ``target`` (None when predicting new text).
    ``doc_id`` groups HoC sentences into their abstract."""

    id: str
    text: str
    text_b: str | None
    target: Target | None
    doc_id: str | None = None


@dataclass(frozen=True)
class BlurbDataset:
    name: str
    mode: Mode
    labels: tuple[str, ...]
    read: Callable[[Path], list]
    scorer: Callable[[Sequence[ClassifyExample], Sequence], BlurbResult]
    pair: bool  # the reader gives a second text (question + context, sentence pair)

    def reader_options(self, dataset_cfg) -> dict:
        """Keyword arguments of :attr:`read` that ``model.dataset`` chooses: PubMedQA's reasoning-free input
        (``pubmedqa_long_answer``); none for the other datasets."""
        if self.name == "pubmedqa" and getattr(dataset_cfg, "pubmedqa_long_answer", False):
            return {"long_answer": True}
        if self.name in folds.FOLD_TASKS:  # BioBERT's fold files (tasks/folds.py) when model.dataset.fold is set
            return {"fold": getattr(dataset_cfg, "fold", None) is not None}
        return {}

    def examples(self, path: Path, **options) -> list[ClassifyExample]:
        """The file's records as examples with label ids / scores / label-index sets (``options``: the
        reader's, from :meth:`reader_options`)."""
        out = []
        for r in self.read(path, **options):
            if self.mode == "single":
                target: Target = self.labels.index(r.label)
            elif self.mode == "regression":
                target = float(r.score)
            else:
                target = frozenset(r.labels)
            out.append(ClassifyExample(r.id, r.text, getattr(r, "text_b", None), target, getattr(r, "doc_id", None)))
        return out

    def prediction(self, example_id: str, output) -> dict:
        """One line of the JSON-lines file ``bio-megatron evaluate <task_name> --pred`` reads."""
        if self.mode == "single":
            return {"id": example_id, "label": self.labels[output]}
        if self.mode == "regression":
            return {"id": example_id, "score": float(output)}
        return {"id": example_id, "labels": sorted(output)}

    def score(self, examples: Sequence[ClassifyExample], outputs: Sequence) -> BlurbResult:
        """The official metric of ``outputs`` (label ids / scores / label-index sets) against the examples."""
        return self.scorer(examples, outputs)


def _labels_of(examples: Sequence[ClassifyExample], outputs: Sequence, labels: Sequence[str]):
    return [labels[e.target] for e in examples], [labels[o] for o in outputs]


def _accuracy(labels: tuple[str, ...]):
    return lambda ex, out: accuracy_scores(*_labels_of(ex, out, labels), labels)


def _positive_f1(labels: tuple[str, ...], positives: tuple[str, ...]):
    return lambda ex, out: positive_f1_scores(*_labels_of(ex, out, labels), positives)


def _pearson(ex: Sequence[ClassifyExample], out: Sequence) -> BlurbResult:
    return pearson_scores([e.target for e in ex], [float(o) for o in out])


def _hoc(ex: Sequence[ClassifyExample], out: Sequence) -> BlurbResult:
    return hoc_scores([e.doc_id for e in ex], [e.target for e in ex], [frozenset(o) for o in out])


DATASETS: dict[str, BlurbDataset] = {
    "pubmedqa": BlurbDataset("pubmedqa", "single", PUBMEDQA_LABELS, blurb_data.read_pubmedqa,
                             _accuracy(PUBMEDQA_LABELS), pair=True),
    "bioasq_yesno": BlurbDataset("bioasq_yesno", "single", BIOASQ_YESNO_LABELS, blurb_data.read_bioasq_yesno,
                                 _accuracy(BIOASQ_YESNO_LABELS), pair=True),
    "ddi": BlurbDataset("ddi", "single", DDI_LABELS, blurb_data.read_ddi, _positive_f1(DDI_LABELS, DDI_POSITIVES),
                        pair=False),
    "gad": BlurbDataset("gad", "single", GAD_LABELS, folds.read_gad,
                        _positive_f1(GAD_LABELS, (GAD_POSITIVE,)), pair=False),
    # EU-ADR: BioBERT's ten folds only (tasks/folds.py), scored as GAD
    "euadr": BlurbDataset("euadr", "single", GAD_LABELS, folds.read_euadr,
                          _positive_f1(GAD_LABELS, (GAD_POSITIVE,)), pair=False),
    "biosses": BlurbDataset("biosses", "regression", REGRESSION_LABELS, blurb_data.read_biosses, _pearson, pair=True),
    "hoc": BlurbDataset("hoc", "multi", HOC_LABELS, blurb_data.read_hoc, _hoc, pair=False),
    # the clinical pair tasks of BLUE / BioELECTRA (readers and formats: tasks/clinical_data.py)
    "mednli": BlurbDataset("mednli", "single", clinical_data.MEDNLI_LABELS, clinical_data.read_mednli,
                           _accuracy(clinical_data.MEDNLI_LABELS), pair=True),
    "clinicalsts": BlurbDataset("clinicalsts", "regression", REGRESSION_LABELS, clinical_data.read_clinicalsts,
                                _pearson, pair=True),
}


def dataset(task_name: str) -> BlurbDataset:
    if task_name not in DATASETS:
        raise DataError(f"model.dataset.task_name {task_name!r} is not one of {sorted(DATASETS)}")
    return DATASETS[task_name]


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut the ends of ``a`` and ``b`` to at most ``budget`` tokens together, as transformers' fast tokenizers do
    (``truncation="longest_first"``): the shorter side (``a`` on a tie) keeps at most half the budget, the longer
    side the rest, so only a side longer than its share loses tokens. (tokenizers 0.23.1 and 0.23.2 alone gave an odd
    budget's extra token to ``b`` even when ``a`` is the longer; 0.22 and 0.23.3 agree with this.)"""
    if len(a) + len(b) <= budget:
        return a, b
    if len(a) <= len(b):
        keep_a = min(len(a), budget // 2)
        return a[:keep_a], b[:budget - keep_a]
    keep_b = min(len(b), budget // 2)
    return a[:budget - keep_b], b[:keep_b]


def encode(examples: Sequence[ClassifyExample], tokenizer, max_seq_length: int) -> list[tuple[list[int], list[int]]]:
    """``(input ids, token types)`` per example, special tokens included, at most ``max_seq_length`` long."""
    firsts = tokenizer.tokenize_batch([e.text for e in examples])  # raw text, as the fast tokenizers
    pairs = [e for e in examples if e.text_b is not None]
    seconds = iter(tokenizer.tokenize_batch([e.text_b for e in pairs]) if pairs else [])
    single_specials = len(tokenizer.single([]))
    out = []
    for e, a in zip(examples, firsts):
        if e.text_b is None:
            ids = tokenizer.single(a[:max_seq_length - single_specials])
            out.append((ids, [0] * len(ids)))
        else:
            a, b = truncate_pair(a, next(seconds), max_seq_length - tokenizer.pair_specials)
            out.append(tokenizer.pair(a, b))
    return out
