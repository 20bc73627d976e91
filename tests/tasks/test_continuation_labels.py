"""``model.dataset.continuation_label``: the label of a ``B-X`` word's later sub-tokens. ``inside`` (the default)
labels them ``I-X`` as transformers' run_ner does with ``b_to_i_label``, so the sub-token labels read left to right
are IOB and an exported model's ``pipeline(aggregation_strategy="simple")`` groups whole entities
(tests/finetune/test_export_pipeline.py runs it); ``word`` keeps NeMo's labelling (each sub-token carries its
word's label). Words are read at their first sub-token under both, so word-level tags do not change. Checked on a
real BC5CDR-chem sentence against transformers' own BertTokenizer segmentation."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.data.pretrain import resolve_vocab
from bio_megatron.tasks.ner_data import (IGNORE_INDEX, Sentence, build_label_map, encode_sentences, read_iob,
                                         word_predictions)
from bio_megatron.utils.errors import DataError
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
    return sent, WordPieceTokenizer(vocab), [hf.tokenize(w) for w in sent.words]


def _b_to_i(sent: Sentence, pieces: list[list[str]], label_map: dict[str, int]) -> list[int]:
    """run_ner's rule spelled out: a word's first piece carries its tag, the others its tag with B- made I-."""
    out = [IGNORE_INDEX]
    for tag, ps in zip(sent.tags, pieces):
        later = "I" + tag[1:] if tag.startswith("B-") else tag
        out += [label_map[tag]] + [label_map[later]] * (len(ps) - 1)
    return out + [IGNORE_INDEX]


def test_later_pieces_of_a_b_word_are_inside(setup):
    sent, tok, pieces = setup
    label_map = build_label_map([sent], inside=True)
    assert label_map == {"O": 0, "B-Chemical": 1, "I-Chemical": 2}
    (inside,) = encode_sentences([sent], tok, label_map, 128, continuation="inside")
    (word,) = encode_sentences([sent], tok, label_map, 128, continuation="word")
    assert inside.labels == _b_to_i(sent, pieces, label_map)
    assert inside.input_ids == word.input_ids and inside.subtokens_mask == word.subtokens_mask
    w = sent.words.index("povidone")  # p ##ov ##ido ##ne | - | i ##od ##ine: B- I- I- words
    start = 1 + sum(len(p) for p in pieces[:w])
    assert inside.labels[start:start + 8] == [1, 2, 2, 2, 2, 2, 2, 2]
    assert word.labels[start:start + 8] == [1, 1, 1, 1, 2, 2, 2, 2]
    # the training labels decoded as predictions give the same words under both: only later pieces differ
    names = {i: t for t, i in label_map.items()}
    for f in (inside, word):
        assert [names[i] for i in word_predictions([max(x, 0) for x in f.labels], f)] == sent.tags
    # first-sub-token-only labelling ignores later pieces whatever the continuation
    (ignored,) = encode_sentences([sent], tok, label_map, 128, ignore_extra_tokens=True, continuation="inside")
    assert ignored.labels[start:start + 8] == [1] + [IGNORE_INDEX] * 3 + [2, 2, IGNORE_INDEX, IGNORE_INDEX]


def test_label_map_gets_the_inside_label_of_one_word_entities(setup):
    """A type seen only as B- (one-word entities) needs its I- for the later pieces; a restored model's map without
    it keeps B- there rather than failing."""
    _, tok, _ = setup
    sent = Sentence(["Naloxone", "reverses", "clonidine"], ["B-Chemical", "O", "B-Chemical"])
    assert build_label_map([sent]) == {"O": 0, "B-Chemical": 1}
    assert build_label_map([sent], inside=True) == {"O": 0, "B-Chemical": 1, "I-Chemical": 2}
    assert build_label_map([Sentence(["a", "b"], ["B", "O"])], inside=True) == {"O": 0, "B": 1, "I": 2}  # untyped
    (f,) = encode_sentences([sent], tok, {"O": 0, "B-Chemical": 1, "I-Chemical": 2}, continuation="inside")
    (old,) = encode_sentences([sent], tok, {"O": 0, "B-Chemical": 1}, continuation="inside")
    n = len(tok.encode_words([sent.words])[0].ids)
    assert n > len(sent.words)  # some word has later pieces
    assert set(f.labels[1:-1]) == {0, 1, 2} and set(old.labels[1:-1]) == {0, 1}
    with pytest.raises(DataError, match="continuation must be 'inside' or 'word'"):
        encode_sentences([sent], tok, {"O": 0, "B-Chemical": 1}, continuation="b_to_i")


@pytest.mark.parametrize("value", [None, "inside", "word"])
def test_the_recipe_key_selects_the_continuation(setup, value):
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.ner import NerTask

    sent, tok, pieces = setup
    over = [f"model.dataset.data_dir={TRAIN.parent}", f"model.dataset.train_file={TRAIN.name}",
            f"model.dataset.max_train_examples={SENTENCE + 1}"]
    cfg = load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml",
                               over + ([f"model.dataset.continuation_label={value}"] if value else []))
    task = NerTask(cfg, tok)
    labels = task.train.features[SENTENCE].labels
    if value == "word":
        assert labels == [IGNORE_INDEX] + [task.label_map[t] for t, ps in zip(sent.tags, pieces) for _ in ps] + \
            [IGNORE_INDEX]
    else:  # the default is inside
        assert labels == _b_to_i(sent, pieces, task.label_map)
