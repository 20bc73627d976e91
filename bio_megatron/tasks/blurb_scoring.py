"""The BLURB evaluators behind ``bio-megatron evaluate <task>`` and ``benchmark``: each reads the gold file with its
BLURB reader, the predictions checked against it (every gold example predicted once), and scores them with the
definitions in ``evaluation/blurb.py`` (docs/EVALUATION.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

_JSONL = "JSON lines, one per gold example: "
_CONLL = ("conlleval columns 'token gold pred' (white-space separated, blank line between sentences; "
          "'-DOCSTART-' lines allowed), one line per gold word in gold order")


@dataclass(frozen=True)
class Evaluator:
    """One task's help text, gold and prediction formats (for ``--help``), and ``score(gold, pred)``."""

    help: str
    gold: str
    pred: str
    score: Callable[..., object]  # (gold, pred) or, for the label tasks, (gold, pred, label_map)
    label_map: bool = False  # accepts the model's label map: integer label ids in the predictions


def _labels(gold: str, pred: str, examples, labels, scorer, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb_predictions import label_parser, read_json_predictions

    ids = [e.id for e in examples]
    preds = read_json_predictions(pred, "label", ids, label_parser(labels, label_map), gold)
    return scorer([e.label for e in examples], [preds[i] for i in ids])


def _pubmedqa(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import PUBMEDQA_LABELS, accuracy_scores
    from bio_megatron.evaluation.blurb_predictions import label_parser, read_json_predictions
    from bio_megatron.tasks.blurb_data import read_pubmedqa_labels

    truth = read_pubmedqa_labels(gold)
    preds = read_json_predictions(pred, "label", list(truth), label_parser(PUBMEDQA_LABELS, label_map), gold)
    return accuracy_scores(list(truth.values()), [preds[i] for i in truth], PUBMEDQA_LABELS)


def _bioasq_yesno(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import BIOASQ_YESNO_LABELS, accuracy_scores
    from bio_megatron.tasks.blurb_data import read_bioasq_yesno

    return _labels(gold, pred, read_bioasq_yesno(gold), BIOASQ_YESNO_LABELS,
                   lambda g, p: accuracy_scores(g, p, BIOASQ_YESNO_LABELS), label_map)


def _ddi(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import DDI_LABELS, DDI_POSITIVES, positive_f1_scores
    from bio_megatron.tasks.blurb_data import read_ddi

    return _labels(gold, pred, read_ddi(gold), DDI_LABELS, lambda g, p: positive_f1_scores(g, p, DDI_POSITIVES),
                   label_map)


def _gad(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import GAD_LABELS, GAD_POSITIVE, positive_f1_scores
    from bio_megatron.tasks.blurb_data import read_gad

    return _labels(gold, pred, read_gad(gold), GAD_LABELS, lambda g, p: positive_f1_scores(g, p, (GAD_POSITIVE,)),
                   label_map)


def _biosses(gold: str, pred: str):
    from bio_megatron.evaluation.blurb import pearson_scores
    from bio_megatron.evaluation.blurb_predictions import read_json_predictions, score_parser
    from bio_megatron.tasks.blurb_data import read_biosses

    examples = read_biosses(gold)
    preds = read_json_predictions(pred, "score", [e.id for e in examples], score_parser, gold)
    return pearson_scores([e.score for e in examples], [preds[e.id] for e in examples])


def _hoc(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import HOC_LABELS, hoc_scores
    from bio_megatron.evaluation.blurb_predictions import label_set_parser, read_json_predictions
    from bio_megatron.tasks.blurb_data import read_hoc

    examples = read_hoc(gold)
    preds = read_json_predictions(pred, "labels", [e.id for e in examples], label_set_parser(HOC_LABELS, label_map),
                                  gold)
    return hoc_scores([e.doc_id for e in examples], [e.labels for e in examples], [preds[e.id] for e in examples])


def _tagged(gold: str, pred: str, reader, tags):
    from bio_megatron.evaluation.blurb_predictions import read_conll_predictions
    from bio_megatron.tasks.blurb_tagging import sentences_of

    sentences = sentences_of(reader(gold))
    words, gold_tags = [s.words for s in sentences], [s.tags for s in sentences]
    return gold_tags, read_conll_predictions(pred, words, gold_tags, tags, gold)


def _ebm_pico(gold: str, pred: str):
    from bio_megatron.evaluation.blurb import PICO_TAGS, pico_scores
    from bio_megatron.tasks.blurb_tagging import read_ebm_pico

    gold_tags, pred_tags = _tagged(gold, pred, read_ebm_pico, PICO_TAGS)
    return pico_scores([t for s in gold_tags for t in s], [t for s in pred_tags for t in s])


def _jnlpba(gold: str, pred: str):
    from bio_megatron.evaluation.blurb import JNLPBA_TAGS, entity_scores
    from bio_megatron.tasks.blurb_tagging import read_jnlpba

    return entity_scores(*_tagged(gold, pred, read_jnlpba, JNLPBA_TAGS))


EVALUATORS: dict[str, Evaluator] = {
    "pubmedqa": Evaluator("PubMedQA (PQA-L) accuracy over yes/no/maybe",
                      "test_ground_truth.json (PMID -> label) or a PQA-L JSON (PMID -> {..., final_decision})",
                      _JSONL + '{"id": "<PMID>", "label": "yes"|"no"|"maybe"}', _pubmedqa, True),
    "bioasq_yesno": Evaluator("BioASQ yes/no accuracy",
                          'BioASQ training/golden JSON ({"questions": [...]}; only "type": "yesno" is scored)',
                          _JSONL + '{"id": "<question id>", "label": "yes"|"no"}', _bioasq_yesno, True),
    "ddi": Evaluator("DDI-2013 micro F1 over the 4 positive classes (DDI-false is the negative)",
                 "BLURB DDI tsv: pair id<TAB>sentence<TAB>label, no header",
                 _JSONL + '{"id": "<pair id>", "label": "DDI-false"|"DDI-advise"|"DDI-effect"|"DDI-int"|'
                          '"DDI-mechanism"}', _ddi, True),
    "gad": Evaluator("GAD F1 of the positive class 1",
                 "BLURB GAD tsv with header index<TAB>sentence<TAB>label",
                 _JSONL + '{"id": "<index>", "label": 0|1} (or "0"|"1")', _gad, True),
    "biosses": Evaluator("BIOSSES Pearson correlation",
                     "BLURB BIOSSES tsv with header pair_id<TAB>sent1<TAB>sent2<TAB>score",
                     _JSONL + '{"id": "<pair_id>", "score": <number>}', _biosses),
    "hoc": Evaluator("HoC abstract-level micro F1 (sentence predictions OR-ed per PMID)",
                 "BLURB HoC tsv with header labels<TAB>sentence<TAB>index (index = PMID_sN)",
                 _JSONL + '{"id": "<PMID_sN>", "labels": [hallmark index 0-9 or name, ...]} per sentence; [] = none',
                 _hoc, True),
    "ebm_pico": Evaluator("EBM PICO word-level macro F1 over I-PAR, I-INT, I-OUT",
                      "BLURB EBM PICO tsv: '-DOCSTART- (PMID)' lines, token<TAB>tag sentences",
                      _CONLL + "; tags O, I-PAR, I-INT, I-OUT", _ebm_pico),
    "jnlpba": Evaluator("JNLPBA (BLURB, untyped) entity-level F1 exactly as conlleval (percent; score = fraction)",
                    "BLURB JNLPBA tsv: '-DOCSTART- PMID' lines, token<TAB>B/I/O sentences",
                    _CONLL + "; tags O, B, I", _jnlpba),
}


def _hoc_blue(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    """``evaluate hoc --metric blue``: gold and predictions read and checked exactly as for BLURB's metric, scored
    with BLUE's abstract-level formula."""
    from bio_megatron.evaluation.blurb import HOC_LABELS
    from bio_megatron.evaluation.blurb_predictions import label_set_parser, read_json_predictions
    from bio_megatron.evaluation.hoc_blue import hoc_blue_scores
    from bio_megatron.tasks.blurb_data import read_hoc

    examples = read_hoc(gold)
    preds = read_json_predictions(pred, "labels", [e.id for e in examples], label_set_parser(HOC_LABELS, label_map),
                                  gold)
    return hoc_blue_scores([e.doc_id for e in examples], [e.labels for e in examples],
                           [preds[e.id] for e in examples])


# ``evaluate <task> --metric <name>``: another publication's formula on the same gold and predictions, keyed by
# (task, metric). bio-lm (paper 004 §3) reports HoC with BLUE's abstract-level F, BLURB with its micro F1.
METRIC_VARIANTS: dict[tuple[str, str], Callable] = {("hoc", "blue"): _hoc_blue}
