"""The official SQuAD v1.1 and v2.0 evaluation logic, re-implemented faithfully.

* v2.0 (``evaluate-v2.0.py``): answers normalised (lower-case, punctuation removed, articles a/an/the
  dropped, white space squeezed); gold answers that normalise to "" are dropped and a question with
  none left is unanswerable with gold ``[""]``; exact match and token F1 are maxima over the gold
  answers; F1 of an empty answer is 1 only if both are empty. Keys, as the script prints them:
  ``exact``, ``f1``, ``total``, and ``HasAns_exact/f1/total``, ``NoAns_exact/f1/total`` when such
  questions exist; with no-answer probabilities also ``best_exact``, ``best_exact_thresh``,
  ``best_f1``, ``best_f1_thresh``. A missing prediction is an error (the script fails on it too).
* v1.1 (``evaluate-v1.1.py``): the keys the script prints, ``exact_match`` and ``f1``; F1 is 0 whenever
  no token is shared (even if both are empty); all gold answers are used; a missing prediction scores 0.

All scores are percentages, as both scripts report them.
"""

from __future__ import annotations

import collections
import json
import math
import re
import string
from typing import Mapping

from bio_megatron.evaluation.inputs import first_few, line_of
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra white space (both official scripts)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_v2(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v2(gold: str, pred: str) -> float:
    """v2.0 token F1: an empty answer on either side scores 1 only when both are empty."""
    g, p = _tokens(gold), _tokens(pred)
    if not g or not p:
        return float(g == p)
    common = collections.Counter(g) & collections.Counter(p)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def f1_v1(pred: str, gold: str) -> float:
    """v1.1 token F1 (no special case for empty strings)."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _questions(dataset: list[dict]):
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: list[dict], predictions: Mapping[str, str]) -> dict:
    """``evaluate-v1.1.py``: {"exact_match", "f1"} in percent over all questions of ``dataset``."""
    exact = f1 = 0.0
    total = 0
    missing = 0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            missing += 1  # the script prints "Unanswered question ... will receive score 0."
            continue
        golds = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        exact += max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
        f1 += max(f1_v1(pred, g) for g in golds)
    if missing:
        log.warning("%d unanswered question(s) receive score 0", missing)
    return {"exact_match": 100.0 * exact / total if total else 0.0, "f1": 100.0 * f1 / total if total else 0.0}


def get_raw_scores(dataset: list[dict], predictions: Mapping[str, str]) -> tuple[dict, dict]:
    """Per-question exact and F1 (v2.0), max over the non-empty gold answers."""
    exact_scores, f1_scores = {}, {}
    missing = []
    for qa in _questions(dataset):
        qid = qa["id"]
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        if not golds:
            golds = [""]  # unanswerable: the only correct prediction is the empty string
        if qid not in predictions:
            missing.append(qid)
            continue
        pred = predictions[qid]
        exact_scores[qid] = max(exact_v2(g, pred) for g in golds)
        f1_scores[qid] = max(f1_v2(g, pred) for g in golds)
    if missing:
        raise DataError(f"{len(missing)} question(s) have no prediction, e.g. {missing[:3]}; the official "
                        f"v2.0 script needs one for every question (\"\" means no answer)")
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores: dict, na_probs: Mapping[str, float], qid_has_ans: dict,
                           threshold: float) -> dict:
    """Questions whose no-answer probability exceeds ``threshold`` are answered with "" instead."""
    out = {}
    for qid, s in scores.items():
        out[qid] = float(not qid_has_ans[qid]) if na_probs[qid] > threshold else s
    return out


def _eval_dict(exact: dict, f1: dict, qids: list[str] | None = None) -> dict:
    if qids is None:
        total = len(exact)
        return {"exact": 100.0 * sum(exact.values()) / total, "f1": 100.0 * sum(f1.values()) / total,
                "total": total}
    total = len(qids)
    return {"exact": 100.0 * sum(exact[k] for k in qids) / total,
            "f1": 100.0 * sum(f1[k] for k in qids) / total, "total": total}


def find_best_thresh(preds: Mapping[str, str], scores: dict, na_probs: Mapping[str, float],
                     qid_has_ans: dict) -> tuple[float, float]:
    """The official sweep over no-answer thresholds: best score (percent) and the threshold reaching it."""
    num_no_ans = sum(1 for k in qid_has_ans if not qid_has_ans[k])
    cur = best = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_has_ans[qid]:
            diff = scores[qid]
        elif preds[qid]:
            diff = -1
        else:
            diff = 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset: list[dict], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict:
    """``evaluate-v2.0.py``: exact/f1/total plus HasAns_* / NoAns_* (and best_* with ``na_probs``)."""
    qid_has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset)}
    has_ans = [k for k, v in qid_has_ans.items() if v]
    no_ans = [k for k, v in qid_has_ans.items() if not v]
    probs = na_probs if na_probs is not None else {k: 0.0 for k in predictions}
    exact_raw, f1_raw = get_raw_scores(dataset, predictions)
    exact_t = apply_no_ans_threshold(exact_raw, probs, qid_has_ans, na_prob_thresh)
    f1_t = apply_no_ans_threshold(f1_raw, probs, qid_has_ans, na_prob_thresh)
    out = _eval_dict(exact_t, f1_t)
    if has_ans:
        out.update({f"HasAns_{k}": v for k, v in _eval_dict(exact_t, f1_t, has_ans).items()})
    if no_ans:
        out.update({f"NoAns_{k}": v for k, v in _eval_dict(exact_t, f1_t, no_ans).items()})
    if na_probs is not None:
        best_exact, exact_thresh = find_best_thresh(predictions, exact_raw, na_probs, qid_has_ans)
        best_f1, f1_thresh = find_best_thresh(predictions, f1_raw, na_probs, qid_has_ans)
        out.update({"best_exact": best_exact, "best_exact_thresh": exact_thresh,
                    "best_f1": best_f1, "best_f1_thresh": f1_thresh})
    return out


def detect_version(dataset_json: dict) -> str:
    """"2.0" if the file says so or any question is marked impossible, else "1.1"."""
    version = str(dataset_json.get("version", ""))
    if version.lstrip("v").startswith("2"):
        return "2.0"
    if any(qa.get("is_impossible") for qa in _questions(dataset_json.get("data", []))):
        return "2.0"
    return "1.1"


def _where(path: str | None, qid: object) -> int | None:
    return line_of(path, json.dumps(qid, ensure_ascii=False)) if path and isinstance(qid, str) and qid else None


def check_dataset(dataset_json: object, path: str | None = None) -> list[str]:
    """Question ids of a SQuAD JSON, after checking the shape both official scripts index blindly
    (``data[].paragraphs[].qas[]`` with a string ``id`` and an ``answers`` list of ``{"text": str}``)."""
    if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
        raise DataError('expected a SQuAD JSON object with a "data" list', path)
    qids = []
    for a, article in enumerate(dataset_json["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataError(f'data[{a}] needs a "paragraphs" list', path)
        for p, para in enumerate(article["paragraphs"]):
            if not isinstance(para, dict) or not isinstance(para.get("qas"), list):
                raise DataError(f'data[{a}].paragraphs[{p}] needs a "qas" list', path)
            for q, qa in enumerate(para["qas"]):
                key = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    question = qa.get("question") if isinstance(qa, dict) else None
                    raise DataError(f'{key} needs a string "id"', path, _where(path, question))
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(
                        isinstance(ans, dict) and isinstance(ans.get("text"), str) for ans in answers):
                    raise DataError(f'{key} (id {qa["id"]!r}) needs "answers": a list of {{"text": ...}} objects '
                                    f'([] for an unanswerable question)', path, _where(path, qa["id"]))
                qids.append(qa["id"])
    if not qids:
        raise DataError("no questions in the data; expected data[].paragraphs[].qas[]", path)
    return qids


def check_predictions(predictions: object, qids: list[str], path: str | None = None) -> None:
    """Predictions must map question ids to strings and answer at least one question of the data; ids the
    data lacks are ignored, as the official scripts do, but logged."""
    if not isinstance(predictions, dict):
        raise DataError("expected a JSON object question id -> answer text", path)
    for qid, pred in predictions.items():
        if not isinstance(pred, str):
            raise DataError(f"prediction for {qid!r} is {type(pred).__name__} {str(pred)[:40]}; expected a string "
                            f'(the answer text, "" for no answer)', path, _where(path, qid))
    known = set(qids)
    unknown = [k for k in predictions if k not in known]
    if len(unknown) == len(predictions):
        raise DataError(f"no prediction is for a question of the data ({len(predictions)} predictions, ids "
                        f"{first_few(unknown)}; the data has e.g. {first_few(qids)}): predictions for another "
                        f"file?", path)
    if unknown:
        log.warning("%s: %d prediction(s) for ids not in the data are ignored: %s", path or "predictions",
                    len(unknown), first_few(unknown))


def check_na_probs(na_probs: object, qids: list[str], path: str | None = None) -> None:
    """The v2.0 threshold sweep needs a numeric no-answer probability for every question."""
    if not isinstance(na_probs, dict):
        raise DataError("expected a JSON object question id -> no-answer probability", path)
    bad = [k for k in qids if isinstance(na_probs.get(k), bool) or not isinstance(na_probs.get(k), (int, float))]
    if bad:
        raise DataError(f"{len(bad)} question(s) have no numeric no-answer probability, e.g. {first_few(bad)}",
                        path, _where(path, bad[0]))
    # JSON's NaN/Infinity parse as floats: NaN > threshold is always false and breaks the sort of the
    # threshold sweep, so the scores would come out silently wrong
    odd = [k for k in qids if not math.isfinite(na_probs[k])]
    if odd:
        raise DataError(f"{len(odd)} question(s) have a non-finite no-answer probability "
                        f"({na_probs[odd[0]]!r} for {odd[0]!r}); expected a finite number", path, _where(path, odd[0]))


def evaluate(dataset_json: dict, predictions: Mapping[str, str], version: str | None = None,
             na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0,
             data_path: str | None = None, predictions_path: str | None = None) -> dict:
    """Score ``predictions`` (question id -> answer text) against a SQuAD JSON with the official logic.

    The inputs are checked first (:func:`check_dataset`, :func:`check_predictions`); the paths, when given,
    are named in the errors. v1.1 scoring of data with unanswerable questions is refused (the v1.1 script
    takes a max over no gold answers and crashes).
    """
    qids = check_dataset(dataset_json, data_path)
    check_predictions(predictions, qids, predictions_path)
    version = version or detect_version(dataset_json)
    data = dataset_json["data"]
    if version.lstrip("v").startswith("1"):
        no_answer = [qa["id"] for qa in _questions(data) if not qa["answers"]]
        if no_answer:
            raise DataError(f"SQuAD v1.1 scoring, but {len(no_answer)} question(s) have no gold answer "
                            f"(v2.0 data, e.g. {first_few(no_answer)}); use version 2.0", data_path,
                            _where(data_path, no_answer[0]))
        return evaluate_v1(data, predictions)
    if na_probs is not None:
        check_na_probs(na_probs, qids)
    return evaluate_v2(data, predictions, na_probs, na_prob_thresh)
