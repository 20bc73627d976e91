"""Vocabulary statistics (paper Table 3) and sentence splitting on real biomedical text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import BertTokenizer

from bio_megatron.cli import main
from bio_megatron.corpus.sentences import boundary_errors, naive_split, split_sentences
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.stats import read_iob, vocab_stats

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "corpus"
CASED = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_cased_vocab.txt"
SHARED_NER = ROOT.parent / "shared" / "data" / "ner"


def test_entity_subtokens_per_word_equal_transformers_count(tmp_path, capsys):
    ner = FIX / "bc5cdr_chem_train_head.tsv"
    rep = vocab_stats(CASED, [ner])["files"][str(ner)]["entity_words"]
    # Independent count: transformers' BertTokenizer over the same entity words.
    hf = BertTokenizer(vocab=str(CASED), do_lower_case=False)
    words = [line.split("\t")[0] for line in ner.read_text().splitlines()
             if "\t" in line and line.split("\t")[1] != "O"]
    pieces = [hf.tokenize(w) for w in words]
    assert rep["words"] == len(words) > 100
    assert rep["tokens_per_word"] == pytest.approx(sum(map(len, pieces)) / len(words), abs=1e-4)
    assert rep["whole_word_coverage"] == pytest.approx(sum(len(p) == 1 for p in pieces) / len(words), abs=1e-4)
    assert main(["vocab", "stats", "--vocab", str(CASED), "--ner-file", str(ner)]) == 0
    assert json.loads(capsys.readouterr().out)["files"][str(ner)]["entity_words"] == rep


@pytest.mark.skipif(not (SHARED_NER / "BC5CDR-chem" / "train.tsv").is_file(), reason="needs ../shared")
def test_bert_cased_reproduces_paper_table3():
    files = [SHARED_NER / "BC5CDR-chem" / "train.tsv", SHARED_NER / "BC5CDR-disease" / "train.tsv"]
    rep = vocab_stats(CASED, files)["files"]
    # BioMegatron Table 3, BERT-cased: 3.012 (BC5-chem), 2.42 (BC5-disease)
    assert rep[str(files[0])]["entity_words"]["tokens_per_word"] == pytest.approx(3.012, abs=0.01)
    assert rep[str(files[1])]["entity_words"]["tokens_per_word"] == pytest.approx(2.42, abs=0.02)


def test_bad_ner_file(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_bytes(b"Selegiline\tB-Chemical\ninduced\tX-Thing\n")
    with pytest.raises(DataError, match=r"train.tsv:2: unknown tag 'X-Thing'"):
        read_iob(bad)
    bad.write_bytes(b"Selegiline\tB-Chemical\nd\xe9j\xe0\tO\n")
    with pytest.raises(DataError, match=r"train.tsv:2: not UTF-8"):
        read_iob(bad)


def test_punkt_beats_naive_regex_on_real_passages():
    gold = json.loads((FIX / "sentence_gold.json").read_text())
    ours = [boundary_errors(split_sentences(g["text"]), g["gold"]) for g in gold]
    naive = [boundary_errors(naive_split(g["text"]), g["gold"]) for g in gold]
    assert sum(a + b for a, b in ours) == 0
    assert sum(a for a, _ in naive) >= len(gold)  # the regex cuts after "vs." / "Fig." in every passage


@pytest.mark.parametrize("text,expected", [
    ("Mice were dosed i.v. twice daily. Plasma levels rose 2.5-fold.",
     ["Mice were dosed i.v. twice daily.", "Plasma levels rose 2.5-fold."]),
    ("As reported by Kiss et al. the bound holds. S. aureus and E. coli grew. See Fig. 2.",
     ["As reported by Kiss et al. the bound holds.", "S. aureus and E. coli grew.", "See Fig. 2."]),
    ("Drugs (e.g. imatinib) inhibit BCR-ABL1. IL-6 rose, i.e. 3.4 vs. 1.2 pg/mL.",
     ["Drugs (e.g. imatinib) inhibit BCR-ABL1.", "IL-6 rose, i.e. 3.4 vs. 1.2 pg/mL."]),
])
def test_biomedical_abbreviations(text, expected):
    assert split_sentences(text) == expected
