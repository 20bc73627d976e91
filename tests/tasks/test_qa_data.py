"""SQuAD windows/offsets, n-best post-processing and bad inputs, on a real SQuAD v2 slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bio_megatron.evaluation.bioasq import build_submission
from bio_megatron.evaluation.squad import evaluate
from bio_megatron.tasks.qa_data import QAExample, build_features, postprocess, read_squad
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json"
TOK = WordPieceTokenizer(ROOT / "bio_megatron/resources/vocab/bert_base_uncased_vocab.txt")


def _oracle_logits(features):
    """Logits peaked at the training targets: post-processing must give the gold answers back."""
    starts, ends = [], []
    for f in features:
        s, e = [0.0] * len(f.input_ids), [0.0] * len(f.input_ids)
        s[f.start_position] += 10.0
        e[f.end_position] += 10.0
        starts.append(s)
        ends.append(e)
    return starts, ends


def test_windows_targets_and_postprocess_round_trip():
    examples = read_squad(SLICE)
    assert any(e.is_impossible for e in examples) and any(e.answers for e in examples)
    feats = build_features(examples, TOK, max_seq_length=96, doc_stride=24, max_query_length=16, training=True)
    assert len(feats) > 2 * len(examples)  # short windows: every context is split
    for f in feats:
        assert len(f.input_ids) <= 96 and f.input_ids[0] == TOK.cls
        ex = examples[f.example_index]
        if f.start_position:
            span = ex.context[f.offsets[f.start_position][0]:f.offsets[f.end_position][1]]
            assert span == ex.answers[0]["text"]
    s, e = _oracle_logits(feats)
    preds, nbest, odds = postprocess(examples, feats, s, e, version_2_with_negative=True)
    result = evaluate(json.loads(SLICE.read_text()), preds)
    assert result["exact"] == 100.0 and result["NoAns_total"] > 0
    for qid, entries in nbest.items():
        assert sum(x["probability"] for x in entries) == pytest.approx(1.0)
        assert len({x["text"] for x in entries}) == len(entries)


def test_null_threshold_and_v1_mode():
    ex = [QAExample("q", "what?", "alpha beta gamma", [{"text": "beta", "answer_start": 6}])]
    feats = build_features(ex, TOK, max_seq_length=32)
    n = len(feats[0].input_ids)
    beta = next(i for i, o in enumerate(feats[0].offsets) if o and ex[0].context[o[0]:o[1]] == "beta")
    s, e = [0.0] * n, [0.0] * n
    s[0], e[0] = 3.0, 3.0          # null score 6
    s[beta], e[beta] = 2.5, 2.5    # best span 5: null - span = 1
    p, _, odds = postprocess(ex, feats, [s], [e], version_2_with_negative=True, null_score_diff_threshold=0.0)
    assert p["q"] == "" and odds["q"] == pytest.approx(1.0)
    p, _, _ = postprocess(ex, feats, [s], [e], version_2_with_negative=True, null_score_diff_threshold=1.5)
    assert p["q"] == "beta"
    p, nb, _ = postprocess(ex, feats, [s], [e], version_2_with_negative=False)
    assert p["q"] == "beta" and all(x["text"] for x in nb["q"])
    # max_answer_length bounds the span in tokens
    s2, e2 = [0.0] * n, [0.0] * n
    s2[beta - 1], e2[beta + 1] = 9.0, 9.0
    p, _, _ = postprocess(ex, feats, [s2], [e2], max_answer_length=2)
    assert p["q"] != "alpha beta gamma"


def test_nbest_feeds_bioasq_submission():
    ex = [QAExample("5503_001", "what?", "EGFR is a kinase.", []), QAExample("5503_002", "what?", "egfr binds.", [])]
    feats = build_features(ex, TOK, max_seq_length=32)
    starts, ends = [], []
    for f in feats:
        s, e = [0.0] * len(f.input_ids), [0.0] * len(f.input_ids)
        s[next(i for i, o in enumerate(f.offsets) if o)] = 5.0
        e[max(i for i, o in enumerate(f.offsets) if o and o[1] <= 4)] = 5.0  # last sub-token of "EGFR"
        starts.append(s)
        ends.append(e)
    _, nbest, _ = postprocess(ex, feats, starts, ends, n_best_size=3)
    sub = build_submission(nbest)
    assert sub["questions"][0]["id"] == "5503" and sub["questions"][0]["exact_answer"][0] == ["EGFR"]


def test_bad_inputs_name_file_and_line(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": "v2.0",\n "data": [\n  {"title": "x",}\n]}')
    with pytest.raises(DataError, match=r"broken\.json:3: broken JSON"):
        read_squad(broken)
    no_ctx = tmp_path / "noctx.json"
    no_ctx.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"qas": [{"id": "qq1", "question": "why?", "answers": []}]}]}]}, indent=1))
    with pytest.raises(DataError, match=r'noctx\.json:\d+: .*no "context"'):
        read_squad(no_ctx)
