"""No silently wrong score (issue 21, item 3): each case was a score that came out wrong with exit 0 on main before
the fix (bb6a95b), and is now right or one line with exit 2.

* ``evaluate biosses`` on predictions scaled to 1e308 (or 1e-308) gave r = 1.0 (the mean overflowed to inf):
  now scipy's r on the unscaled scores.
* A NaN no-answer probability (``evaluate squad --na-prob-file``) or n-best probability (``bioasq-submission``)
  was scored (NaN compares false): now refused naming the file (and line).
* ``evaluate re`` read integer predictions in a fixed label order whatever the model's label map, and any
  ``CPR:<n>`` as a negative: now ids need ``--label-ids``/``--label-map`` and names must be gold names; the
  BLURB label tasks take ``--label-map`` for integer ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from reliability.cli_log import run_cli

ROOT = Path(__file__).resolve().parents[2]
SQUAD = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"


def _score(argv: list[str]) -> tuple[int, dict | None, str]:
    """Exit code, the printed JSON object (or None) and the ERROR line of ``bio-megatron argv``."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc, msg = run_cli(argv)
    text = out.getvalue()
    return rc, (json.loads(text) if rc == 0 and text.strip() else None), msg


# --- Pearson -------------------------------------------------------------------------------------------------

def _biosses(tmp_path: Path, gold: np.ndarray, pred: list[float]) -> tuple[Path, Path]:
    g, p = tmp_path / "test.tsv", tmp_path / "pred.jsonl"
    g.write_text("pair_id\tsent1\tsent2\tscore\n"
                 + "".join(f"p{i}\ta {i}\tb {i}\t{float(s)!r}\n" for i, s in enumerate(gold)), encoding="utf-8")
    p.write_text("".join(json.dumps({"id": f"p{i}", "score": s}) + "\n" for i, s in enumerate(pred)))
    return g, p


@pytest.mark.parametrize("scale", [1e308, 1e-308, 1.0])
def test_biosses_pearson_at_any_magnitude_equals_scipy(tmp_path, scale):
    rng = np.random.default_rng(0)
    gold = rng.uniform(0.0, 4.0, 40)
    pred = np.clip(gold / 4.0 * 1.5 + rng.normal(0.0, 0.3, 40), -1.7, 1.7)  # x 1e308 stays below 1.8e308
    g, p = _biosses(tmp_path, gold, [float(v * scale) for v in pred])
    rc, out, msg = _score(["evaluate", "biosses", "--gold", str(g), "--pred", str(p)])
    assert rc == 0, msg
    assert out["pearson"] == pytest.approx(scipy.stats.pearsonr(gold, pred)[0], rel=1e-12, abs=1e-12)


def test_biosses_constant_predictions_are_refused(tmp_path):
    g, p = _biosses(tmp_path, np.array([1.0, 2.0, 3.0]), [1e308, 1e308, 1e308])
    rc, _, msg = _score(["evaluate", "biosses", "--gold", str(g), "--pred", str(p)])
    assert rc == 2 and "undefined: all predicted scores are equal" in msg, msg


def test_biosses_nan_prediction_names_file_and_line(tmp_path):
    g, p = _biosses(tmp_path, np.array([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0])
    p.write_text(p.read_text().replace('"score": 2.0', '"score": NaN'))
    rc, _, msg = _score(["evaluate", "biosses", "--gold", str(g), "--pred", str(p)])
    assert rc == 2 and f"{p}:2:" in msg and "not a finite number" in msg, msg


# --- NaN in the other evaluators -------------------------------------------------------------------------------

def test_squad_nan_no_answer_probability_names_file_and_line(tmp_path):
    data = json.loads(SQUAD.read_text())
    qids = [q["id"] for a in data["data"] for para in a["paragraphs"] for q in para["qas"]]
    preds, na = tmp_path / "preds.json", tmp_path / "na.json"
    preds.write_text(json.dumps({q: "" for q in qids}))
    probs = {q: 0.5 for q in qids}
    probs[qids[3]] = float("nan")
    na.write_text(json.dumps(probs, indent=1))  # NaN is written as the JSON extension NaN; one id per line
    rc, _, msg = _score(["evaluate", "squad", "--data", str(SQUAD), "--predictions", str(preds),
                         "--na-prob-file", str(na)])
    assert rc == 2 and f"{na}:5:" in msg and "non-finite no-answer probability" in msg and qids[3] in msg, msg


def test_bioasq_nan_nbest_probability_is_refused(tmp_path):
    nbest = tmp_path / "nbest.json"
    nbest.write_text('{"q1_001": [{"text": "Wnt", "probability": NaN}, {"text": "notch", "probability": 0.4}]}')
    rc, _, msg = _score(["evaluate", "bioasq-submission", "--nbest", str(nbest)])
    assert rc == 2 and str(nbest) in msg and "finite numeric \"probability\"" in msg, msg


# --- label ids and label names ---------------------------------------------------------------------------------

GOLD_RE = ["CPR:3", "false", "CPR:4", "CPR:9", "false", "CPR:3"]
PRED_RE = ["CPR:3", "CPR:4", "CPR:4", "false", "false", "CPR:9"]
PERMUTED = ["CPR:9", "CPR:3", "false", "CPR:6", "CPR:4", "CPR:5"]  # a model's own label order


def test_re_integer_ids_need_the_label_map_and_equal_names_with_it(tmp_path):
    gold, names, ids, label_map = (tmp_path / f for f in ("gold.txt", "names.txt", "ids.txt", "label_ids.csv"))
    gold.write_text("\n".join(GOLD_RE) + "\n")
    names.write_text("\n".join(PRED_RE) + "\n")
    ids.write_text("".join(f"{PERMUTED.index(x)}\n" for x in PRED_RE))
    label_map.write_text("\n".join(PERMUTED) + "\n")
    rc, by_name, msg = _score(["evaluate", "re", "--gold", str(gold), "--pred", str(names)])
    assert rc == 0, msg
    rc, _, msg = _score(["evaluate", "re", "--gold", str(gold), "--pred", str(ids)])
    assert rc == 2 and f"{ids}:1: label id 1" in msg and "--label-ids" in msg and "'CPR:3'" in msg, msg
    rc, by_id, msg = _score(["evaluate", "re", "--gold", str(gold), "--pred", str(ids), "--label-map", str(label_map)])
    assert rc == 0, msg
    assert by_id == by_name and by_name["f1"] == pytest.approx(0.5)


def test_re_prediction_outside_the_gold_names_is_refused(tmp_path):
    gold, pred = tmp_path / "gold.txt", tmp_path / "pred.txt"
    gold.write_text("\n".join(GOLD_RE) + "\n")
    pred.write_text("CPR:3\nCPR:7\n" + "false\n" * 4)  # CPR:7 would have counted as a negative
    rc, _, msg = _score(["evaluate", "re", "--gold", str(gold), "--pred", str(pred)])
    assert rc == 2 and f"{pred}:2: unknown label 'CPR:7'" in msg and "'CPR:9'" in msg, msg


DDI = ["DDI-false", "DDI-effect", "DDI-mechanism", "DDI-advise", "DDI-int", "DDI-effect"]
DDI_PRED = ["DDI-false", "DDI-effect", "DDI-effect", "DDI-advise", "DDI-false", "DDI-int"]
DDI_MODEL_ORDER = ["DDI-mechanism", "DDI-int", "DDI-false", "DDI-effect", "DDI-advise"]


def test_ddi_integer_ids_need_the_label_map_and_equal_names_with_it(tmp_path):
    gold, names, ids, label_map = (tmp_path / f for f in ("test.tsv", "names.jsonl", "ids.jsonl", "label_ids.csv"))
    gold.write_text("".join(f"d{i}\tsentence {i}\t{lab}\n" for i, lab in enumerate(DDI)))
    names.write_text("".join(json.dumps({"id": f"d{i}", "label": lab}) + "\n" for i, lab in enumerate(DDI_PRED)))
    ids.write_text("".join(json.dumps({"id": f"d{i}", "label": DDI_MODEL_ORDER.index(lab)}) + "\n"
                           for i, lab in enumerate(DDI_PRED)))
    label_map.write_text("\n".join(DDI_MODEL_ORDER) + "\n")
    rc, by_name, msg = _score(["evaluate", "ddi", "--gold", str(gold), "--pred", str(names)])
    assert rc == 0, msg
    rc, _, msg = _score(["evaluate", "ddi", "--gold", str(gold), "--pred", str(ids)])
    assert rc == 2 and f"{ids}:1:" in msg and "integer label id" in msg and "--label-map" in msg, msg
    assert "'DDI-mechanism'" in msg, msg
    rc, by_id, msg = _score(["evaluate", "ddi", "--gold", str(gold), "--pred", str(ids), "--label-map", str(label_map)])
    assert rc == 0, msg
    assert by_id == by_name
    label_map.write_text("false\nCPR:3\n")  # another task's label map
    rc, _, msg = _score(["evaluate", "ddi", "--gold", str(gold), "--pred", str(ids), "--label-map", str(label_map)])
    assert rc == 2 and str(label_map) in msg and "'CPR:3'" in msg, msg


def test_hoc_label_map_reads_model_ids_as_the_names_they_stand_for(tmp_path):
    from bio_megatron.evaluation.blurb import HOC_LABELS

    gold, names, ids, label_map = (tmp_path / f for f in ("test.tsv", "names.jsonl", "ids.jsonl", "label_ids.csv"))
    cells = [{0, 3}, set(), {9}, {3, 4}]
    gold.write_text("labels\tsentence\tindex\n" + "".join(
        ",".join(f"{k}_{int(k in c)}" for k in range(10)) + f"\tsentence {i}\t{100 + i // 2}_s{i}\n"
        for i, c in enumerate(cells)))
    pred = [[0], [9], [9, 3], [4]]
    model_order = list(reversed(HOC_LABELS))
    names.write_text("".join(json.dumps({"id": f"{100 + i // 2}_s{i}", "labels": [HOC_LABELS[k] for k in p]}) + "\n"
                             for i, p in enumerate(pred)))
    ids.write_text("".join(json.dumps({"id": f"{100 + i // 2}_s{i}",
                                       "labels": [model_order.index(HOC_LABELS[k]) for k in p]}) + "\n"
                           for i, p in enumerate(pred)))
    label_map.write_text("\n".join(model_order) + "\n")
    rc, by_name, msg = _score(["evaluate", "hoc", "--gold", str(gold), "--pred", str(names)])
    assert rc == 0, msg
    rc, by_id, msg = _score(["evaluate", "hoc", "--gold", str(gold), "--pred", str(ids), "--label-map", str(label_map)])
    assert rc == 0, msg
    assert by_id == by_name and 0.0 < by_name["f1"] < 1.0
