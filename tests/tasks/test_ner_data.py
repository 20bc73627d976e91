"""NER readers/converters, label map and both sub-word label schemes on real BC5CDR slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.evaluation.conlleval import evaluate_sequences
from bio_megatron.tasks.ner_data import (IGNORE_INDEX, build_label_map, encode_sentences, iob_to_nemo,
                                         nemo_to_iob, read_iob, read_label_ids, read_nemo, word_predictions,
                                         write_label_ids)
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "ner"
VOCABS = {"cased": ROOT / "bio_megatron/resources/vocab/bert_base_cased_vocab.txt",
          "uncased": ROOT / "bio_megatron/resources/vocab/bert_base_uncased_vocab.txt"}


def test_iob_nemo_round_trip(tmp_path):
    src = FIX / "bc5cdr_chem_devel_head.tsv"
    text, labels = iob_to_nemo(src, tmp_path, "dev")
    assert text.name == "text_dev.txt" and labels.name == "labels_dev.txt"
    back = nemo_to_iob(text, labels, tmp_path / "back.tsv")
    assert back.read_text() == src.read_text()
    assert [s.words for s in read_nemo(text, labels)] == [s.words for s in read_iob(src)]


def test_label_map_pad_first_then_sorted(tmp_path):
    sentences = read_iob(FIX / "bc5cdr_chem_devel_head.tsv") + read_iob(FIX / "bc5cdr_disease_devel_head.tsv")
    lm = build_label_map(sentences)
    assert lm == {"O": 0, "B-Chemical": 1, "B-Disease": 2, "I-Chemical": 3, "I-Disease": 4}
    write_label_ids(tmp_path / "label_ids.csv", lm)
    assert read_label_ids(tmp_path / "label_ids.csv") == lm


@pytest.mark.parametrize("vocab", ["cased", "uncased"])
@pytest.mark.parametrize("ignore_extra_tokens", [False, True])
def test_alignment_schemes_and_word_predictions(vocab, ignore_extra_tokens):
    tok = WordPieceTokenizer(VOCABS[vocab])
    sentences = read_iob(FIX / "bc5cdr_chem_devel_head.tsv")
    lm = build_label_map(sentences)
    feats = encode_sentences(sentences, tok, lm, max_seq_length=512, ignore_extra_tokens=ignore_extra_tokens)
    multi = 0
    for s, f in zip(sentences, feats):
        assert f.input_ids[0] == tok.cls and f.input_ids[-1] == tok.sep
        assert f.labels[0] == f.labels[-1] == IGNORE_INDEX  # ignore_start_end
        firsts = [i for i, m in enumerate(f.subtokens_mask) if m]
        assert [f.word_ids[i] for i in firsts] == list(range(len(s.words)))
        for pos, w in enumerate(f.word_ids):
            if w is None:
                continue
            expected = lm[s.tags[w]] if (pos in firsts or not ignore_extra_tokens) else IGNORE_INDEX
            assert f.labels[pos] == expected
            assert f.loss_mask[pos] == int(expected != IGNORE_INDEX)
            multi += pos not in firsts
        # predicting the training labels back gives the gold tags per word (labels at first sub-token)
        preds = [max(lab, 0) for lab in f.labels]
        inv = {i: t for t, i in lm.items()}
        assert [inv[p] for p in word_predictions(preds, f)] == s.tags
    assert multi > 0  # the slice really has words split into several sub-tokens


def test_truncation_and_start_end_not_ignored():
    tok = WordPieceTokenizer(VOCABS["cased"])
    s = read_iob(FIX / "bc5cdr_chem_devel_head.tsv")[:1]
    lm = build_label_map(s)
    f = encode_sentences(s, tok, lm, max_seq_length=8, ignore_start_end=False)[0]
    assert len(f.input_ids) == 8 and f.labels[0] == 0 and f.loss_mask[0] == 1
    words = word_predictions([1] * 8, f)
    assert len(words) == len(s[0].words) and words[-1] == 0  # cut-off words get the pad label
    # per-word predictions plug straight into the conlleval metric
    inv = {i: t for t, i in lm.items()}
    assert evaluate_sequences([s[0].tags], [[inv[w] for w in words]])["found_correct"] >= 1


def test_bad_inputs_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("aspirin\tB-Chemical\nworks\tX-Thing\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2: unknown tag 'X-Thing'"):
        read_iob(bad)
    bad.write_text("aspirin\tB-Chemical\tO\n")
    with pytest.raises(DataError, match=r"bad\.tsv:1:"):
        read_iob(bad)
    text, labels = tmp_path / "text_train.txt", tmp_path / "labels_train.txt"
    text.write_text("a b\nc d e\n")
    labels.write_text("O O\nO O\n")
    with pytest.raises(DataError, match=r"text_train\.txt:2: 3 words but 2 labels"):
        read_nemo(text, labels)
    labels.write_text("O O\nO B-Disease O\n")
    with pytest.raises(DataError, match=r"labels_train\.txt:2: unknown tag 'B-Disease'"):
        read_nemo(text, labels, labels=["O", "B-Chemical", "I-Chemical"])


def test_nemo_lines_end_at_newline_only(tmp_path):
    """A form feed or line separator inside a sentence (text pasted from PDFs) is part of it, not a new sentence:
    str.splitlines split there and shifted every later sentence against its labels (a count mismatch at best)."""
    text, labels = tmp_path / "text_train.txt", tmp_path / "labels_train.txt"
    text.write_text("aspirin\x0cdose was high\ncaused\u2028rash\n", encoding="utf-8")
    labels.write_text("B-Chemical O O O\nO O\n", encoding="utf-8")
    sentences = read_nemo(text, labels)
    assert [len(s.words) for s in sentences] == [4, 2]
    assert sentences[0].tags == ["B-Chemical", "O", "O", "O"]
    (tmp_path / "label_ids.csv").write_text("O\nB-Chemical\x85x\n", encoding="utf-8")
    assert read_label_ids(tmp_path / "label_ids.csv") == {"O": 0, "B-Chemical\x85x": 1}
