"""The two sub-word labelling schemes of the paper's Figure 1, one key apart (``model.dataset.ignore_extra_tokens``),
on a real BC5CDR-chem training sentence whose chemicals break into several WordPiece pieces; the segmentation is
checked against transformers' own BertTokenizer. Under both schemes a word is predicted from its first
sub-token, so the word-level tags (and the conlleval score) decode the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.data.pretrain import resolve_vocab
from bio_megatron.evaluation.conlleval import evaluate_sequences
from bio_megatron.tasks.ner_data import IGNORE_INDEX, build_label_map, encode_sentences, read_iob, word_predictions
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_train_head.tsv"
SENTENCE = 15  # "... kanamycin - colistin and povidone - iodine ...": B- and I- words of 3-4 pieces each


@pytest.fixture(scope="module")
def setup():
    import transformers

    vocab = resolve_vocab("bert_base_cased")
    sent = read_iob(TRAIN)[SENTENCE]
    hf = transformers.BertTokenizer(str(vocab), do_lower_case=False)
    return sent, WordPieceTokenizer(vocab), hf, [hf.tokenize(w) for w in sent.words]


def _expected(sent, pieces, label_map, ignore_extra_tokens: bool) -> list[int]:
    """Labels per position from the definitions: [CLS]/[SEP] ignored; each word's first piece carries its tag;
    the other pieces carry it too (every sub-token labelled) or are ignored (first sub-token only)."""
    out = [IGNORE_INDEX]
    for tag, ps in zip(sent.tags, pieces):
        rest = IGNORE_INDEX if ignore_extra_tokens else label_map[tag]
        out += [label_map[tag]] + [rest] * (len(ps) - 1)
    return out + [IGNORE_INDEX]


@pytest.mark.parametrize("ignore_extra_tokens", [False, True])
def test_label_ids_follow_the_scheme(setup, ignore_extra_tokens):
    sent, tok, hf, pieces = setup
    label_map = build_label_map([sent])
    assert label_map == {"O": 0, "B-Chemical": 1, "I-Chemical": 2}
    (f,) = encode_sentences([sent], tok, label_map, 128, ignore_extra_tokens=ignore_extra_tokens)
    assert f.input_ids == hf.convert_tokens_to_ids(["[CLS]"] + [p for ps in pieces for p in ps] + ["[SEP]"])
    assert f.labels == _expected(sent, pieces, label_map, ignore_extra_tokens)
    assert f.loss_mask == [int(label != IGNORE_INDEX) for label in f.labels]
    # "povidone - iodine" (B-Chemical I-Chemical I-Chemical) as p ##ov ##ido ##ne | - | i ##od ##ine, spelled out:
    w = sent.words.index("povidone")
    assert pieces[w:w + 3] == [["p", "##ov", "##ido", "##ne"], ["-"], ["i", "##od", "##ine"]]
    start = 1 + sum(len(p) for p in pieces[:w])
    span = f.labels[start:start + 8]
    x = IGNORE_INDEX
    assert span == ([1, x, x, x, 2, 2, x, x] if ignore_extra_tokens else [1, 1, 1, 1, 2, 2, 2, 2])


@pytest.mark.parametrize("ignore_extra_tokens", [False, True])
def test_words_are_decoded_from_their_first_sub_token(setup, ignore_extra_tokens):
    sent, tok, _, pieces = setup
    label_map = build_label_map([sent])
    names = {i: t for t, i in label_map.items()}
    (f,) = encode_sentences([sent], tok, label_map, 128, ignore_extra_tokens=ignore_extra_tokens)
    # a model right at every first sub-token and wrong everywhere else (continuations, [CLS], [SEP])
    pred = [label if first else (label_map["B-Chemical"] if label in (0, IGNORE_INDEX) else 0)
            for label, first in zip(f.labels, f.subtokens_mask)]
    tags = [names[i] for i in word_predictions(pred, f)]
    assert tags == sent.tags
    assert evaluate_sequences([sent.tags], [tags])["f1"] == 100.0
    # the first piece is what counts: "iodine" read as O breaks the entity "povidone - iodine"
    w = sent.words.index("iodine")
    pred[1 + sum(len(p) for p in pieces[:w])] = 0
    tags = [names[i] for i in word_predictions(pred, f)]
    assert tags[w] == "O" and evaluate_sequences([sent.tags], [tags])["f1"] < 100.0


@pytest.mark.parametrize("value", [False, True])
def test_the_recipe_key_selects_the_scheme(setup, value):
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.ner import NerTask

    sent, tok, _, pieces = setup
    cfg = load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml",
                               [f"model.dataset.data_dir={TRAIN.parent}", f"model.dataset.train_file={TRAIN.name}",
                                f"model.dataset.max_train_examples={SENTENCE + 1}",
                                f"model.dataset.ignore_extra_tokens={str(value).lower()}",
                                "model.dataset.continuation_label=word"])  # NeMo's labelling, as _expected
    task = NerTask(cfg, tok)
    assert task.train.features[SENTENCE].labels == _expected(sent, pieces, task.label_map, value)
