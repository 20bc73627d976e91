"""Extractive QA data: SQuAD v1.1/v2.0 JSON (and BioASQ factoid in SQuAD format) -> features -> answers.

Windows follow BERT/NeMo: ``doc_stride`` is the step between window starts (not HF's overlap), the
question is cut to ``max_query_length`` sub-tokens, every window is
``[CLS] question [SEP] context-window [SEP]`` (RoBERTa: ``<s> question </s></s> context-window </s>``) of at
most ``max_seq_length``. Each context position keeps
its character offsets into the context, so predicted spans are cut from the original text.
Post-processing is BERT's ``write_predictions``: top ``n_best_size`` starts x ends, spans of at most
``max_answer_length`` tokens whose start has maximal context in its window, null score = min over
windows of start[CLS]+end[CLS]; with ``version_2_with_negative`` the answer is "" when
null - best_span > ``null_score_diff_threshold``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from bio_megatron.evaluation.bioasq import golden_factoids
from bio_megatron.evaluation.inputs import load_json as load_text_json
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import load_json  # noqa: F401  (re-exported: tasks.qa, cli.evaluate)
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


@dataclass
class QAExample:
    qid: str
    question: str
    context: str
    answers: list[dict] = field(default_factory=list)  # [{"text", "answer_start"}]
    is_impossible: bool = False


@dataclass
class QAFeature:
    example_index: int
    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]  # context character span per position, None outside the context
    token_is_max_context: list[bool]
    start_position: int = 0  # training target; 0 ([CLS]) = no answer in this window
    end_position: int = 0


def _line_of(raw: str, needle: str) -> int | None:
    pos = raw.find(needle)
    return raw.count("\n", 0, pos) + 1 if pos >= 0 else None


def read_squad(path: str | Path, bad_answer_start: str | None = "error") -> list[QAExample]:
    """Examples of a SQuAD v1.1/v2.0 (or BioASQ-in-SQuAD-format) file, validated.

    An answer whose ``answer_start`` does not point at its text (``context[start:start + len(text)] != text``)
    would train on the wrong span, or as "no answer" where it falls outside every window: with
    ``bad_answer_start="error"`` it is a :class:`DataError` naming the file, line and question id, with
    ``"drop"`` its question is left out and counted in the log, with ``None`` (answers unused: ``predict``)
    it is not checked."""
    if bad_answer_start not in ("error", "drop", None):
        raise ValueError(f"bad_answer_start must be 'error', 'drop' or None, not {bad_answer_start!r}")
    # strict UTF-8 (a bad byte is file and line, not a traceback), a BOM allowed
    data = load_text_json(path, 'a SQuAD JSON object with a "data" list')
    path = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError('expected a SQuAD JSON object with a "data" list', path)
    raw = None
    examples: list[QAExample] = []
    dropped: list[str] = []
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article.get("paragraphs", [])):
            qas = para.get("qas", [])
            context = para.get("context")
            if not isinstance(context, str) or not context.strip():
                raw = raw if raw is not None else Path(path).read_text(encoding="utf-8")
                first = qas[0].get("id") if qas and isinstance(qas[0], dict) else None
                line = _line_of(raw, json.dumps(first)) if first else None
                raise DataError(f'data[{a}].paragraphs[{p}] has questions but no "context" text', path, line)
            for q, qa in enumerate(qas):
                if not isinstance(qa, dict) or "id" not in qa or not qa.get("question"):
                    raise DataError(f'data[{a}].paragraphs[{p}].qas[{q}] needs "id" and "question"', path)
                impossible = bool(qa.get("is_impossible", False))
                answers = qa.get("answers", [])
                for ans in answers:
                    start, text = ans.get("answer_start"), ans.get("text")
                    if not isinstance(start, int) or not isinstance(text, str):
                        raw = raw if raw is not None else Path(path).read_text(encoding="utf-8")
                        raise DataError(f"question {qa['id']}: answer needs 'text' and integer 'answer_start'",
                                        path, _line_of(raw, json.dumps(qa["id"])))
                bad = next((ans for ans in answers if not _at_start(context, ans)), None)
                if bad is not None and bad_answer_start == "error":
                    raw = raw if raw is not None else Path(path).read_text(encoding="utf-8")
                    start, text = bad["answer_start"], bad["text"]
                    raise DataError(f"question {qa['id']}: answer_start {start} does not point at the answer "
                                    f"{text[:60]!r} (the context there reads {context[start:start + len(text)][:60]!r})"
                                    f"; fix the file, or set model.dataset.bad_answer_start=drop to leave such "
                                    f"questions out", path, _line_of(raw, json.dumps(qa["id"])))
                if bad is not None and bad_answer_start == "drop":
                    dropped.append(str(qa["id"]))
                    continue
                examples.append(QAExample(str(qa["id"]), qa["question"], context, answers, impossible))
    if dropped:
        log.warning("%s: %d question(s) dropped, their answer_start not pointing at the answer text "
                    "(model.dataset.bad_answer_start=drop), e.g. %s", path, len(dropped), ", ".join(dropped[:3]))
    return examples


def _at_start(context: str, answer: dict) -> bool:
    start, text = answer["answer_start"], answer["text"]
    if isinstance(start, bool) or start < 0:  # context[-3:] would read the end of the context
        return False
    return context[start:start + len(text)] == text


def _max_context(windows: list[tuple[int, int]], w: int, pos: int) -> bool:
    """BERT's _check_is_max_context: is window ``w`` the one where token ``pos`` has most context."""
    best, best_w = None, None
    for i, (start, length) in enumerate(windows):
        end = start + length - 1
        if pos < start or pos > end:
            continue
        score = min(pos - start, end - pos) + 0.01 * length
        if best is None or score > best:
            best, best_w = score, i
    return best_w == w


def build_features(examples: Sequence[QAExample], tokenizer, max_seq_length: int = 384,
                   doc_stride: int = 128, max_query_length: int = 64, training: bool = False) -> list[QAFeature]:
    """Sliding-window features; with ``training`` the start/end targets are set (0 = [CLS] if absent).

    The window is laid out by ``tokenizer.pair`` (BERT ``[CLS] q [SEP] c [SEP]``, types 0/1; RoBERTa
    ``<s> q </s></s> c </s>``, one type), with question and context encoded apart as transformers' fast
    tokenizers encode a pair (so each keeps its own offsets, trimmed of leading spaces for RoBERTa)."""
    q_encs = tokenizer.encode_texts([e.question for e in examples])
    c_encs = tokenizer.encode_texts([e.context for e in examples])
    features = []
    for ei, (ex, qe, ce) in enumerate(zip(examples, q_encs, c_encs)):
        q_ids = qe.ids[:max_query_length]
        max_ctx = max_seq_length - len(q_ids) - tokenizer.pair_specials
        if max_ctx <= 0:
            raise DataError(f"max_seq_length ({max_seq_length}) leaves no room for context after a question of "
                            f"{len(q_ids)} tokens; raise it or lower max_query_length ({max_query_length})")
        windows, start = [], 0
        while True:
            length = min(len(ce.ids) - start, max_ctx)
            windows.append((start, length))
            if start + length >= len(ce.ids):
                break
            start += min(length, doc_stride)
        for wi, (ws, wl) in enumerate(windows):
            ids, types = tokenizer.pair(q_ids, ce.ids[ws:ws + wl])
            head = len(ids) - wl - 1  # the window sits just before the last special token
            offsets = [None] * head + [tuple(o) for o in ce.offsets[ws:ws + wl]] + [None]
            maxc = [False] * head + [_max_context(windows, wi, ws + k) for k in range(wl)] + [False]
            feat = QAFeature(ei, ids, types, offsets, maxc)
            if training and not ex.is_impossible and ex.answers:
                a = ex.answers[0]
                s_char, e_char = a["answer_start"], a["answer_start"] + len(a["text"])
                ctx_pos = [i for i, o in enumerate(offsets) if o is not None]
                if ctx_pos and offsets[ctx_pos[0]][0] <= s_char and offsets[ctx_pos[-1]][1] >= e_char:
                    feat.start_position = next(i for i in ctx_pos if offsets[i][1] > s_char)
                    feat.end_position = max(i for i in ctx_pos if offsets[i][0] < e_char)
            features.append(feat)
    return features


def _softmax(scores: list[float]) -> list[float]:
    m = max(scores)
    exps = [math.exp(s - m) for s in scores]
    total = sum(exps)
    return [x / total for x in exps]


def postprocess(examples: Sequence[QAExample], features: Sequence[QAFeature],
                start_logits: Sequence[Sequence[float]], end_logits: Sequence[Sequence[float]],
                n_best_size: int = 20, max_answer_length: int = 30, version_2_with_negative: bool = False,
                null_score_diff_threshold: float = 0.0) -> tuple[dict, dict, dict]:
    """Answers from per-feature start/end logits: (predictions, nbest, null_odds), all keyed by question id.

    ``nbest[qid]`` is a list of ``{"text", "probability", "start_logit", "end_logit"}`` (softmax over the
    n-best scores), the format :func:`bio_megatron.evaluation.bioasq.build_submission` reads.
    """
    by_example: dict[int, list[int]] = {}
    for fi, f in enumerate(features):
        by_example.setdefault(f.example_index, []).append(fi)
    predictions, nbest_out, null_odds = {}, {}, {}
    for ei, ex in enumerate(examples):
        prelim, null = [], None
        for fi in by_example.get(ei, []):
            f = features[fi]
            s, e = np.asarray(start_logits[fi], dtype=np.float64), np.asarray(end_logits[fi], dtype=np.float64)
            n = len(f.input_ids)
            s, e = s[:n], e[:n]
            if null is None or s[0] + e[0] < null[0]:
                null = (float(s[0] + e[0]), float(s[0]), float(e[0]))
            starts = np.argsort(-s, kind="stable")[:n_best_size]
            ends = np.argsort(-e, kind="stable")[:n_best_size]
            for si in starts:
                for ej in ends:
                    if f.offsets[si] is None or f.offsets[ej] is None or ej < si:
                        continue
                    if ej - si + 1 > max_answer_length or not f.token_is_max_context[si]:
                        continue
                    prelim.append((float(s[si] + e[ej]), float(s[si]), float(e[ej]),
                                   f.offsets[si][0], f.offsets[ej][1]))
        if version_2_with_negative and null is not None:
            prelim.append((null[0], null[1], null[2], None, None))
        prelim.sort(key=lambda x: -x[0])
        nbest, seen = [], set()
        for score, sl, el, cs, ce in prelim:
            if len(nbest) >= n_best_size:
                break
            text = "" if cs is None else ex.context[cs:ce]
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": sl, "end_logit": el})
        if version_2_with_negative and "" not in seen and null is not None:
            nbest.append({"text": "", "start_logit": null[1], "end_logit": null[2]})
        if not nbest:
            nbest.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})  # as BERT does
        for entry, p in zip(nbest, _softmax([n["start_logit"] + n["end_logit"] for n in nbest])):
            entry["probability"] = p
        best_non_null = next((n for n in nbest if n["text"]), None)
        if not version_2_with_negative:
            predictions[ex.qid] = nbest[0]["text"]
        else:
            diff = null[0] - (best_non_null["start_logit"] + best_non_null["end_logit"]) if best_non_null else math.inf
            null_odds[ex.qid] = diff
            predictions[ex.qid] = "" if diff > null_score_diff_threshold else best_non_null["text"]
        nbest_out[ex.qid] = nbest
    return predictions, nbest_out, null_odds


def read_bioasq_golden(path: str | Path) -> dict[str, list]:
    """Question id -> gold ``exact_answer`` for the factoid questions of an official BioASQ golden JSON."""
    return golden_factoids(load_json(path), str(path))
