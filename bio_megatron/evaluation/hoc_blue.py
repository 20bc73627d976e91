"""BLUE's HoC metric (Peng et al. 2019; used by bio-lm, Lewis et al. 2020): example-based F over abstracts.

The definition, re-derived from BLUE's ``blue/eval_hoc.py`` (ncbi-nlp/BLUE_Benchmark):

1. sentences are grouped into abstracts by the ``index`` prefix before ``_`` and their label sets OR-ed (the same
   grouping as BLURB's, :func:`bio_megatron.evaluation.blurb.group_by_document`);
2. for each abstract ``a`` with gold set ``G_a`` and predicted set ``P_a``: ``p_a = |G_a & P_a| / |P_a|`` and
   ``r_a = |G_a & P_a| / |G_a|``;
3. ``P`` and ``R`` are the unweighted means of ``p_a`` and ``r_a`` over the abstracts, and
   ``F = 2 P R / (P + R)`` -- the harmonic mean of the two means, not the mean of per-abstract F.

Undefined ratios are 0: an abstract with nothing predicted has ``p_a = 0`` (as BLUE's script), one without a gold
hallmark has ``r_a = 0`` (BLUE's script divides by zero there -- its test set has no such abstract; BLURB's split
keeps them, so they are counted in ``documents_without_label``). BLUE's script prints its precision and recall
under each other's names (it unpacks ``(P, R, F)`` as ``(R, P, F)``); F is symmetric, so unaffected. Here
``precision`` is the mean per-abstract precision. Docs: docs/EVALUATION.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable, Sequence

from bio_megatron.evaluation.blurb import group_by_document
from bio_megatron.utils.errors import DataError


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


@dataclass(frozen=True)
class HocBlueResult:
    """BLUE's abstract-level HoC scores (fractions); ``f1`` is the headline."""

    metric: ClassVar[str] = "blue_abstract_f1"
    precision: float
    recall: float
    f1: float
    documents: int
    sentences: int
    documents_without_label: int
    documents_without_prediction: int

    @property
    def score(self) -> float:
        return self.f1


def hoc_blue_scores(doc_ids: Sequence[str], gold: Sequence[Iterable[int]],
                    pred: Sequence[Iterable[int]]) -> HocBlueResult:
    """BLUE's HoC P/R/F from per-sentence ``doc_ids[i]`` with gold/predicted hallmark indices."""
    if not (len(doc_ids) == len(gold) == len(pred)):
        raise DataError(f"{len(doc_ids)} document ids, {len(gold)} gold and {len(pred)} predicted sentences")
    if not gold:
        raise DataError("no sentences to score")
    gold_docs, pred_docs = group_by_document(doc_ids, gold), group_by_document(doc_ids, pred)
    precisions, recalls = [], []
    for doc, g in gold_docs.items():
        p = pred_docs[doc]
        hit = len(g & p)
        precisions.append(_ratio(hit, len(p)))
        recalls.append(_ratio(hit, len(g)))
    mean_p, mean_r = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    f1 = 2 * mean_p * mean_r / (mean_p + mean_r) if mean_p + mean_r else 0.0
    return HocBlueResult(mean_p, mean_r, f1, len(gold_docs), len(gold), sum(not g for g in gold_docs.values()),
                         sum(not p for p in pred_docs.values()))

