"""BLURB's metrics for the tasks beyond NER/ChemProt/QA, each equal to an independent computation.

Definitions (sources in docs/EVALUATION.md; all values are fractions, Pearson in [-1, 1]):

* PubMedQA, BioASQ yes/no: accuracy (``sklearn.metrics.accuracy_score``); macro-F1 over the classes is
  reported beside it, as the PubMedQA paper does.
* DDI-2013: micro precision/recall/F1 over the four positive classes, ``DDI-false`` a negative
  (``precision_recall_fscore_support(labels=DDI_POSITIVES, average="micro")``); GAD: F1 of the positive
  class ``1`` (the same with one class).
* BIOSSES: Pearson's r between gold and predicted similarity scores (own numpy code; scipy is the oracle).
* HoC: sentence predictions are grouped into abstracts by PMID (the ``index`` prefix before ``_``) and
  OR-ed, as BLURB's evaluation does; micro precision/recall/F1 over all abstract x hallmark cells. An
  abstract without any hallmark is an all-zero row: it only adds false positives.
* EBM PICO: word-level F1 of each PICO element (``I-PAR``, ``I-INT``, ``I-OUT``; every word counted, the
  ``O`` class not averaged) and their unweighted mean.
* JNLPBA: conlleval's entity-level F1 on the untyped B/I/O tags (percent, as ``evaluate ner``).

Every result is a frozen dataclass with the class variable ``metric`` (BLURB's headline metric), the
property ``score`` (its value on the 0-1 scale) and :func:`as_dict` for the JSON the CLI prints.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterable, Protocol, Sequence

import numpy as np

from bio_megatron.evaluation.chemprot import chemprot_scores
from bio_megatron.evaluation.conlleval import evaluate_sequences
from bio_megatron.utils.errors import DataError

PUBMEDQA_LABELS: tuple[str, ...] = ("yes", "no", "maybe")
BIOASQ_YESNO_LABELS: tuple[str, ...] = ("yes", "no")
DDI_NEGATIVE = "DDI-false"
DDI_POSITIVES: tuple[str, ...] = ("DDI-advise", "DDI-effect", "DDI-int", "DDI-mechanism")
DDI_LABELS: tuple[str, ...] = (DDI_NEGATIVE,) + DDI_POSITIVES
GAD_LABELS: tuple[str, ...] = ("0", "1")
GAD_POSITIVE = "1"
# Index order of BLURB's HoC files (``0_0,1_1,...``): the hallmark names sorted alphabetically.
HOC_LABELS: tuple[str, ...] = (
    "activating invasion and metastasis", "avoiding immune destruction", "cellular energetics",
    "enabling replicative immortality", "evading growth suppressors", "genomic instability and mutation",
    "inducing angiogenesis", "resisting cell death", "sustaining proliferative signaling",
    "tumor promoting inflammation")
PICO_CLASSES: tuple[str, ...] = ("I-PAR", "I-INT", "I-OUT")  # participants, interventions, outcomes
PICO_TAGS: tuple[str, ...] = ("O",) + PICO_CLASSES
JNLPBA_TAGS: tuple[str, ...] = ("O", "B", "I")


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0  # scikit-learn's value for an undefined ratio (zero_division default)


@dataclass(frozen=True)
class ClassScores:
    """Precision/recall/F1 of one class; ``support`` gold and ``predicted`` predicted members."""

    precision: float
    recall: float
    f1: float
    support: int
    predicted: int

    @classmethod
    def from_counts(cls, tp: int, predicted: int, support: int) -> ClassScores:
        return cls(_ratio(tp, predicted), _ratio(tp, support), _ratio(2 * tp, predicted + support), support,
                   predicted)


class BlurbResult(Protocol):
    """What a suite needs of every result: the metric's name and its value on BLURB's scale."""

    metric: ClassVar[str]

    @property
    def score(self) -> float: ...


@dataclass(frozen=True)
class AccuracyResult:
    """PubMedQA and BioASQ yes/no."""

    metric: ClassVar[str] = "accuracy"
    accuracy: float
    correct: int
    total: int
    macro_f1: float
    per_class: dict[str, ClassScores]

    @property
    def score(self) -> float:
        return self.accuracy


@dataclass(frozen=True)
class PositiveF1Result:
    """DDI and GAD: micro P/R/F1 over the positive classes; ``accuracy`` is micro over all classes."""

    metric: ClassVar[str] = "micro_f1"
    precision: float
    recall: float
    f1: float
    support: int
    accuracy: float
    total: int
    per_class: dict[str, ClassScores]

    @property
    def score(self) -> float:
        return self.f1


@dataclass(frozen=True)
class PearsonResult:
    """BIOSSES."""

    metric: ClassVar[str] = "pearson"
    pearson: float
    pairs: int

    @property
    def score(self) -> float:
        return self.pearson


@dataclass(frozen=True)
class HocResult:
    """HoC: micro over ``documents`` x ``len(HOC_LABELS)`` cells; ``per_label`` at the document level."""

    metric: ClassVar[str] = "micro_f1"
    precision: float
    recall: float
    f1: float
    documents: int
    sentences: int
    documents_without_label: int
    per_label: dict[str, ClassScores]

    @property
    def score(self) -> float:
        return self.f1


@dataclass(frozen=True)
class PicoResult:
    """EBM PICO: ``macro_f1`` is the mean of the three ``per_class`` F1 (word level)."""

    metric: ClassVar[str] = "macro_f1"
    macro_f1: float
    macro_precision: float
    macro_recall: float
    micro_f1: float
    accuracy: float
    words: int
    per_class: dict[str, ClassScores]

    @property
    def score(self) -> float:
        return self.macro_f1


@dataclass(frozen=True)
class EntityResult:
    """JNLPBA: conlleval's report (percent, as ``evaluate ner``); ``score`` is its F1 as a fraction."""

    metric: ClassVar[str] = "entity_f1"
    precision: float
    recall: float
    f1: float
    accuracy: float
    tokens: int
    found_correct: int
    found_guessed: int
    correct: int
    per_type: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return self.f1 / 100.0


def as_dict(result: BlurbResult, task: str | None = None) -> dict[str, Any]:
    """The JSON object of a result: ``task``, ``metric``, ``score`` (0-1 scale), then its fields."""
    head = {"task": task} if task else {}
    return {**head, "metric": result.metric, "score": result.score, **asdict(result)}  # type: ignore[call-overload]


def report_text(result: BlurbResult, task: str) -> str:
    """A few human-readable lines: the headline, then one line per class where the result has classes."""
    lines = [f"{task}: {result.metric} {result.score:.4f}"]
    if isinstance(result, AccuracyResult):
        lines[0] += f" ({result.correct}/{result.total}; macro F1 {result.macro_f1:.4f})"
    elif isinstance(result, (PositiveF1Result, HocResult)):
        lines[0] += f" (precision {result.precision:.4f}, recall {result.recall:.4f})"
    elif isinstance(result, PearsonResult):
        lines[0] += f" over {result.pairs} pairs"
    elif isinstance(result, PicoResult):
        lines[0] += f" over {result.words} words (micro F1 {result.micro_f1:.4f})"
    elif isinstance(result, EntityResult):
        lines[0] += (f" (precision {result.precision:.2f}%, recall {result.recall:.2f}%, "
                     f"{result.found_correct} gold entities)")
    classes = getattr(result, "per_class", None) or getattr(result, "per_label", None) or {}
    width = max((len(name) for name in classes), default=0)
    for name, c in classes.items():
        lines.append(f"  {name:<{width}}  P {c.precision:.4f}  R {c.recall:.4f}  F1 {c.f1:.4f}  "
                     f"support {c.support}  predicted {c.predicted}")
    return "\n".join(lines)


def _check_lengths(gold: Sequence, pred: Sequence, what: str) -> None:
    if len(gold) != len(pred):
        raise DataError(f"{len(gold)} gold {what} but {len(pred)} predictions")
    if not gold:
        raise DataError(f"no {what} to score")


def _per_class(gold: Sequence[str], pred: Sequence[str], labels: Iterable[str]) -> dict[str, ClassScores]:
    tp = Counter(g for g, p in zip(gold, pred) if g == p)
    n_gold, n_pred = Counter(gold), Counter(pred)
    return {label: ClassScores.from_counts(tp[label], n_pred[label], n_gold[label]) for label in labels}


def accuracy_scores(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> AccuracyResult:
    """Accuracy, plus per-class P/R/F1 and their unweighted mean F1 over ``labels``."""
    _check_lengths(gold, pred, "labels")
    correct = sum(g == p for g, p in zip(gold, pred))
    per_class = _per_class(gold, pred, labels)
    macro = sum(c.f1 for c in per_class.values()) / len(per_class)
    return AccuracyResult(correct / len(gold), correct, len(gold), macro, per_class)


def positive_f1_scores(gold: Sequence[str], pred: Sequence[str], positives: Sequence[str]) -> PositiveF1Result:
    """Micro P/R/F1 over ``positives`` (every other label is a negative): DDI's four classes, GAD's ``1``."""
    _check_lengths(gold, pred, "labels")
    r = chemprot_scores(gold, pred, positives)  # the same definition as ChemProt's, other classes
    per_class = {k: ClassScores(**v) for k, v in r["per_class"].items()}
    return PositiveF1Result(r["precision"], r["recall"], r["f1"], r["support"], r["accuracy"], len(gold), per_class)


def _centred_unit(v: np.ndarray) -> np.ndarray:
    """``v`` scaled into [-1, 1] by its largest magnitude, then centred: Pearson's r is unchanged by a positive
    scale, and neither the mean nor the sums of squares can overflow (1e308 scores) or underflow (1e-308)."""
    peak = float(np.max(np.abs(v)))
    u = v / peak if peak > 0.0 else v
    d = u - u.mean()
    return d - d.mean()  # the corrected two-pass: removes the rounding left in the first mean


def pearson_scores(gold: Sequence[float], pred: Sequence[float]) -> PearsonResult:
    """Pearson's r in float64, as ``scipy.stats.pearsonr`` at any magnitude. Undefined (an error, not the NaN
    scipy returns) when either side is constant or has fewer than 2 pairs; a non-finite score is an error."""
    _check_lengths(gold, pred, "scores")
    if len(gold) < 2:
        raise DataError("Pearson's correlation needs at least 2 pairs")
    x, y = np.asarray(gold, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    for side, v in (("gold", x), ("predicted", y)):
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:  # the readers refuse these with file and line; a caller passing them gets no NaN score
            raise DataError(f"{side} score {float(v[bad[0]])!r} (pair {bad[0] + 1}) is not a finite number")
    dx, dy = _centred_unit(x), _centred_unit(y)
    sxx, syy = float(dx @ dx), float(dy @ dy)
    if sxx == 0.0 or syy == 0.0:
        side, values = ("gold", x) if sxx == 0.0 else ("predicted", y)
        raise DataError(f"Pearson's correlation is undefined: all {side} scores are equal ({values[0]:g})")
    r = float(dx @ dy) / (math.sqrt(sxx) * math.sqrt(syy))
    return PearsonResult(max(-1.0, min(1.0, r)), len(gold))


def group_by_document(doc_ids: Sequence[str], label_sets: Sequence[Iterable[int]]) -> dict[str, set[int]]:
    """Document id -> union of its sentences' labels (BLURB's abstract-level HoC labels), in first-seen order."""
    docs: dict[str, set[int]] = defaultdict(set)
    for doc, labels in zip(doc_ids, label_sets):
        docs[doc].update(labels)
    return dict(docs)


def hoc_scores(doc_ids: Sequence[str], gold: Sequence[Iterable[int]], pred: Sequence[Iterable[int]],
               n_labels: int = len(HOC_LABELS)) -> HocResult:
    """Abstract-level micro P/R/F1: per sentence ``doc_ids[i]`` with gold/predicted label indices."""
    _check_lengths(gold, pred, "sentences")
    if len(doc_ids) != len(gold):
        raise DataError(f"{len(doc_ids)} document ids for {len(gold)} sentences")
    gold_docs, pred_docs = group_by_document(doc_ids, gold), group_by_document(doc_ids, pred)
    names = HOC_LABELS if n_labels == len(HOC_LABELS) else tuple(str(i) for i in range(n_labels))
    tp, n_gold, n_pred = [0] * n_labels, [0] * n_labels, [0] * n_labels
    for doc, g in gold_docs.items():
        p = pred_docs[doc]
        for i in range(n_labels):
            tp[i] += i in g and i in p
            n_gold[i] += i in g
            n_pred[i] += i in p
    micro = ClassScores.from_counts(sum(tp), sum(n_pred), sum(n_gold))
    per_label = {names[i]: ClassScores.from_counts(tp[i], n_pred[i], n_gold[i]) for i in range(n_labels)}
    empty = sum(not g for g in gold_docs.values())
    return HocResult(micro.precision, micro.recall, micro.f1, len(gold_docs), len(gold), empty, per_label)


def pico_scores(gold: Sequence[str], pred: Sequence[str], classes: Sequence[str] = PICO_CLASSES) -> PicoResult:
    """Word-level F1 per PICO class and the macro mean, over flat per-word tag lists."""
    _check_lengths(gold, pred, "words")
    per_class = _per_class(gold, pred, classes)
    n = len(per_class)
    tp = sum(1 for g, p in zip(gold, pred) if g == p and g in per_class)
    micro = ClassScores.from_counts(tp, sum(c.predicted for c in per_class.values()),
                                    sum(c.support for c in per_class.values()))
    return PicoResult(sum(c.f1 for c in per_class.values()) / n, sum(c.precision for c in per_class.values()) / n,
                      sum(c.recall for c in per_class.values()) / n, micro.f1,
                      sum(g == p for g, p in zip(gold, pred)) / len(gold), len(gold), per_class)


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> EntityResult:
    """conlleval on per-sentence tag lists (JNLPBA's untyped chunks have the empty type)."""
    if not gold:
        raise DataError("no sentences to score")
    return EntityResult(**evaluate_sequences(gold, pred))

