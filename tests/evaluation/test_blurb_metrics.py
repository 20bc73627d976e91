"""BLURB metrics vs. scikit-learn, scipy and seqeval on the real gold files with perturbed predictions, and
``bio-megatron evaluate <task>`` end to end on the synthetic fixtures (scores, and exit 2 on bad predictions)."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path

import numpy as np
import pytest

from reliability.cli_log import run_cli
from bio_megatron.evaluation.blurb import (BIOASQ_YESNO_LABELS, DDI_LABELS, DDI_POSITIVES, HOC_LABELS,
                                           JNLPBA_TAGS, PICO_CLASSES, PICO_TAGS, PUBMEDQA_LABELS,
                                           accuracy_scores, entity_scores, hoc_scores, pearson_scores,
                                           pico_scores, positive_f1_scores)
from bio_megatron.tasks.blurb_data import (read_bioasq_yesno, read_biosses, read_ddi, read_gad, read_hoc,
                                           read_pubmedqa_labels)
from bio_megatron.tasks.blurb_tagging import read_ebm_pico, read_jnlpba, sentences_of
from bio_megatron.utils.errors import DataError

metrics = pytest.importorskip("sklearn.metrics")
ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "blurb"
BLURB = ROOT.parent / "shared" / "data" / "blurb"
needs_shared = pytest.mark.skipif(not (BLURB / "HoC" / "SOURCES.md").is_file(),
                                  reason="needs ../shared/data/blurb (GPL-3.0 / CC BY-NC data is not in the project)")


def _flip(gold: list, choices, seed: int, rate: float = 0.2) -> list:
    """Each item replaced, with probability ``rate``, by a random choice (which may be the same)."""
    rng = random.Random(seed)
    return [rng.choice(choices) if rng.random() < rate else g for g in gold]


def _check_accuracy(gold: list[str], pred: list[str], labels) -> None:
    ours = accuracy_scores(gold, pred, labels)
    assert ours.accuracy == pytest.approx(metrics.accuracy_score(gold, pred), abs=1e-12)
    assert ours.macro_f1 == pytest.approx(metrics.f1_score(gold, pred, labels=list(labels), average="macro"),
                                          abs=1e-12)
    p, r, f, s = metrics.precision_recall_fscore_support(gold, pred, labels=list(labels), zero_division=0)
    for i, label in enumerate(labels):
        c = ours.per_class[label]
        assert (c.precision, c.recall, c.f1, c.support) == pytest.approx((p[i], r[i], f[i], s[i]), abs=1e-12)


def _check_positive_f1(gold: list[str], pred: list[str], positives) -> None:
    ours = positive_f1_scores(gold, pred, positives)
    p, r, f, _ = metrics.precision_recall_fscore_support(gold, pred, labels=list(positives), average="micro",
                                                         zero_division=0)
    assert (ours.precision, ours.recall, ours.f1) == pytest.approx((p, r, f), abs=1e-12)


@needs_shared
def test_pubmedqa_ddi_gad_equal_sklearn_on_real_gold():
    truth = read_pubmedqa_labels(BLURB / "PubMedQA/test_ground_truth.json")
    ddi = [e.label for e in read_ddi(BLURB / "DDI/test.tsv")]
    gad = [e.label for e in read_gad(BLURB / "GAD/test.tsv")]
    for seed in range(3):
        _check_accuracy(list(truth.values()), _flip(list(truth.values()), PUBMEDQA_LABELS, seed), PUBMEDQA_LABELS)
        _check_positive_f1(ddi, _flip(ddi, DDI_LABELS, seed), DDI_POSITIVES)
        pred = _flip(gad, ("0", "1"), seed)
        ours = positive_f1_scores(gad, pred, ("1",))
        assert ours.f1 == pytest.approx(metrics.f1_score(gad, pred, pos_label="1"), abs=1e-12)
        assert ours.precision == pytest.approx(metrics.precision_score(gad, pred, pos_label="1"), abs=1e-12)


def test_bioasq_yesno_accuracy_equals_sklearn_on_fixture():  # BioASQ data needs registration: synthetic only
    gold = [e.label for e in read_bioasq_yesno(FIX / "BioASQ/yesno_golden.json")]
    for seed in range(3):
        _check_accuracy(gold, _flip(gold, BIOASQ_YESNO_LABELS, seed, 0.5), BIOASQ_YESNO_LABELS)


@needs_shared
def test_biosses_pearson_equals_scipy_on_real_gold():
    stats = pytest.importorskip("scipy.stats")
    gold = [e.score for s in ("train", "dev", "test") for e in read_biosses(BLURB / "BIOSSES" / f"{s}.tsv")]
    rng = np.random.default_rng(0)
    for scale in (0.3, 1.0, 3.0):
        pred = list(np.asarray(gold) + rng.normal(0, scale, len(gold)))
        assert pearson_scores(gold, pred).pearson == pytest.approx(stats.pearsonr(gold, pred)[0], abs=1e-12)
    assert pearson_scores(gold, [-g for g in gold]).pearson == pytest.approx(-1.0)
    with pytest.raises(DataError, match="all predicted scores are equal"):
        pearson_scores(gold, [2.0] * len(gold))


def test_pearson_of_a_model_that_outputs_nan_is_an_error_not_one():
    """Fine-tuning scores BIOSSES with pearson_scores directly (tasks/classify_data.py): a NaN output came out as
    r = 1.0 (min(1.0, nan) is 1.0), which checkpoint selection would have kept as the best."""
    for bad in (math.nan, math.inf):
        with pytest.raises(DataError, match=r"predicted score (nan|inf) \(pair 2\) is not a finite number"):
            pearson_scores([1.0, 2.0, 3.0], [1.0, bad, 2.5])


@needs_shared
def test_hoc_equals_sklearn_micro_over_abstract_cells():
    sentences = read_hoc(BLURB / "HoC/test.tsv")
    rng = np.random.default_rng(1)
    gold_bits = np.array([[i in e.labels for i in range(10)] for e in sentences])
    for rate in (0.05, 0.2):
        pred_bits = gold_bits ^ (rng.random(gold_bits.shape) < rate)
        pred = [set(np.flatnonzero(row).tolist()) for row in pred_bits]
        ours = hoc_scores([e.doc_id for e in sentences], [e.labels for e in sentences], pred)
        # the oracle's grouping: BLURB's rule, the id before "_", sentence rows OR-ed into an abstract row
        docs = sorted({e.id.split("_")[0] for e in sentences})
        row = {d: k for k, d in enumerate(docs)}
        y_true, y_pred = np.zeros((len(docs), 10), bool), np.zeros((len(docs), 10), bool)
        for e, g, p in zip(sentences, gold_bits, pred_bits):
            y_true[row[e.id.split("_")[0]]] |= g
            y_pred[row[e.id.split("_")[0]]] |= p
        assert ours.documents == 371 and ours.documents_without_label == int((~y_true.any(1)).sum())
        oracle = [f(y_true, y_pred, average="micro") for f in (metrics.precision_score, metrics.recall_score,
                                                               metrics.f1_score)]
        assert [ours.precision, ours.recall, ours.f1] == pytest.approx(oracle, abs=1e-12)
        per_label = metrics.f1_score(y_true, y_pred, average=None, zero_division=0)
        assert [ours.per_label[name].f1 for name in HOC_LABELS] == pytest.approx(list(per_label), abs=1e-12)


@needs_shared
def test_ebm_pico_equals_sklearn_macro_f1_over_pio_words():
    gold = [t for s in sentences_of(read_ebm_pico(BLURB / "EBM_PICO/test.tsv")) for t in s.tags]
    pred = _flip(gold, PICO_TAGS, seed=0)
    ours = pico_scores(gold, pred)
    assert ours.macro_f1 == pytest.approx(metrics.f1_score(gold, pred, labels=list(PICO_CLASSES),
                                                           average="macro"), abs=1e-12)
    assert ours.micro_f1 == pytest.approx(metrics.f1_score(gold, pred, labels=list(PICO_CLASSES),
                                                           average="micro"), abs=1e-12)
    p, r, f, s = metrics.precision_recall_fscore_support(gold, pred, labels=list(PICO_CLASSES))
    assert [ours.per_class[c].f1 for c in PICO_CLASSES] == pytest.approx(list(f), abs=1e-12)
    assert (ours.macro_precision, ours.macro_recall) == pytest.approx((p.mean(), r.mean()), abs=1e-12)
    assert ours.words == 51784 and ours.accuracy == pytest.approx(metrics.accuracy_score(gold, pred))


@needs_shared
def test_jnlpba_equals_seqeval_on_untyped_chunks():
    seqeval = pytest.importorskip("seqeval.metrics")
    gold = [s.tags for s in sentences_of(read_jnlpba(BLURB / "JNLPBA/test.tsv"))]
    pred = [_flip(tags, JNLPBA_TAGS, seed) for seed, tags in enumerate(gold)]  # ill-formed I after O included
    ours = entity_scores(gold, pred)
    assert ours.found_correct == 8662
    assert (ours.precision, ours.recall, ours.f1) == pytest.approx(
        (100 * seqeval.precision_score(gold, pred), 100 * seqeval.recall_score(gold, pred),
         100 * seqeval.f1_score(gold, pred)), abs=1e-9)
    assert ours.score == pytest.approx(ours.f1 / 100)


# --- the CLI on the synthetic fixtures ----------------------------------------------------------------------
_CLI = {"pubmedqa": ("PubMedQA/test_ground_truth.json", "PubMedQA/test.pred.jsonl"),
        "bioasq_yesno": ("BioASQ/yesno_golden.json", "BioASQ/yesno.pred.jsonl"),
        "ddi": ("DDI/test.tsv", "DDI/test.pred.jsonl"), "gad": ("GAD/test.tsv", "GAD/test.pred.jsonl"),
        "biosses": ("BIOSSES/test.tsv", "BIOSSES/test.pred.jsonl"), "hoc": ("HoC/test.tsv", "HoC/test.pred.jsonl"),
        "ebm_pico": ("EBM_PICO/test.tsv", "EBM_PICO/test.pred.conll"),
        "jnlpba": ("JNLPBA/test.tsv", "JNLPBA/test.pred.conll")}


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and the messages logged at WARNING and above (where the CLI reports errors)."""
    rc, msg = run_cli(argv, logging.WARNING, " | ")
    return rc, capsys.readouterr().out, msg


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _oracle(task: str) -> float:
    """The headline of each fixture pair, computed by the outside library from the raw files."""
    gold, pred = (FIX / p for p in _CLI[task])
    if task in ("ebm_pico", "jnlpba"):
        rows = [line.split() for line in pred.read_text().splitlines() if line and not line.startswith("-DOC")]
        g, p = [r[1] for r in rows], [r[2] for r in rows]
        if task == "ebm_pico":
            return metrics.f1_score(g, p, labels=list(PICO_CLASSES), average="macro")
        return pytest.importorskip("seqeval.metrics").f1_score([g], [p])  # no chunk crosses a sentence here
    preds = {str(d["id"]): d for d in _jsonl(pred)}
    if task == "biosses":
        examples = read_biosses(gold)
        return pytest.importorskip("scipy.stats").pearsonr([e.score for e in examples],
                                                           [preds[e.id]["score"] for e in examples])[0]
    if task == "hoc":
        docs = sorted({e.doc_id for e in read_hoc(gold)})
        y = np.zeros((2, len(docs), 10), bool)
        for e in read_hoc(gold):
            for i in e.labels:
                y[0, docs.index(e.doc_id), i] = True
            for i in preds[e.id]["labels"]:
                y[1, docs.index(e.doc_id), i if isinstance(i, int) else HOC_LABELS.index(i)] = True
        return metrics.f1_score(y[0], y[1], average="micro")
    if task == "pubmedqa":
        truth = json.loads(gold.read_text())
        return metrics.accuracy_score(list(truth.values()), [preds[k]["label"] for k in truth])
    examples = {"bioasq_yesno": read_bioasq_yesno, "ddi": read_ddi, "gad": read_gad}[task](gold)
    g, p = [e.label for e in examples], [str(preds[e.id]["label"]) for e in examples]
    if task == "bioasq_yesno":
        return metrics.accuracy_score(g, p)
    return metrics.f1_score(g, p, labels=list(DDI_POSITIVES) if task == "ddi" else ["1"], average="micro")


@pytest.mark.parametrize("task", sorted(_CLI))
def test_cli_scores_fixtures(capsys, tmp_path, task):
    gold, pred = (str(FIX / p) for p in _CLI[task])
    out_json = tmp_path / "out" / "score.json"
    rc, out, msg = _run(capsys, ["evaluate", task, "--gold", gold, "--pred", pred, "--json", str(out_json)])
    assert rc == 0, msg
    result = json.loads(out)
    assert result["task"] == task and json.loads(out_json.read_text()) == result
    assert 0 < result["score"] < 1 and result["score"] == pytest.approx(_oracle(task), abs=1e-12)


def _bad_line(tmp_path: Path, task: str, index: int, line: str | None) -> Path:
    """The task's fixture predictions with line ``index`` replaced (or dropped when ``line`` is None)."""
    lines = (FIX / _CLI[task][1]).read_text().splitlines()
    if line is None:
        del lines[index]
    else:
        lines[index] = line
    path = tmp_path / f"{task}.pred"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("task,index,line,needles", [
    ("ddi", 1, '{"id": "DDI-DrugBank.d901.s1.p0", "label": "DDI-advise"', (":2:", "broken JSON")),
    ("ddi", 1, '["DDI-advise"]', (":2:", "not a JSON object")),
    ("gad", 0, '{"label": 1}', (":1:", 'no string "id"')),
    ("gad", 2, '{"id": "2", "prediction": 1}', (":3:", 'has no "label"')),
    ("gad", 2, '{"id": "77", "label": 1}', (":3:", "'77' is not in the gold file")),
    ("gad", 2, '{"id": "1", "label": 1}', (":3:", "predicted twice (also on line 2)")),
    ("gad", 2, None, ("1 of the 6 ids", "'2'")),
    ("ddi", 0, '{"id": "DDI-DrugBank.d901.s0.p0", "label": "DDI-false "}', (":1:", "is not one of")),
    ("pubmedqa", 3, '{"id": "90000014", "label": "Yes"}', (":4:", '"Yes" is not one of')),
    ("bioasq_yesno", 0, '{"id": "5f000000000000000000a002", "label": "yes"}', (":1:", "not in the gold file")),
    ("biosses", 4, '{"id": "44", "score": "high"}', (":5:", "not a finite number")),
    ("hoc", 2, '{"id": "9000001_s2", "labels": [10]}', (":3:", "neither an index 0..9")),
    ("hoc", 2, '{"id": "9000001_s2", "labels": 8}', (":3:", "not a list")),
    ("ebm_pico", 4, "for O I-XYZ", (":5:", "predicted tag 'I-XYZ'")),
    ("ebm_pico", 4, "four O O", (":5:", "'four' tagged 'O', but word 3")),
    ("jnlpba", 2, "IL-9 B", (":3:", "2 field(s)")),
    ("jnlpba", 2, None, (":3:", "'receptor' tagged 'I', but word 1")),
    ("jnlpba", -1, None, ("19 words, but the gold file",)),
])
def test_cli_refuses_bad_predictions(capsys, tmp_path, task, index, line, needles):
    pred = _bad_line(tmp_path, task, index, line)
    rc, out, msg = _run(capsys, ["evaluate", task, "--gold", str(FIX / _CLI[task][0]), "--pred", str(pred)])
    assert rc == 2 and out == "", "a score was printed for bad input"
    assert str(pred) in msg and "Traceback" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize("task", ["gad", "jnlpba"])
def test_cli_refuses_empty_predictions(capsys, tmp_path, task):
    (tmp_path / "empty").write_text("\n")
    empty = str(tmp_path / "empty")
    rc, out, msg = _run(capsys, ["evaluate", task, "--gold", str(FIX / _CLI[task][0]), "--pred", empty])
    assert (rc, out) == (2, "") and f"{empty}: " in msg and ("empty file" in msg or "no words" in msg)
