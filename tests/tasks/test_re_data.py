"""ChemProt readers: SciBERT JSONL, the original BioCreative VI files (negatives, anonymisation), NeMo tsv."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.tasks.re_data import (CHEMICAL_MASK, GENE_MASK, read_chemprot_original, read_nemo_tsv,
                                        read_scibert_jsonl, split_sentences, write_nemo_tsv)
from bio_megatron.utils.errors import DataError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "re"


def test_scibert_jsonl_maps_to_cpr_groups():
    ex = read_scibert_jsonl(FIX / "chemprot_scibert_dev_head.jsonl")
    assert len(ex) == 40
    assert {e.label for e in ex} <= {"CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"}
    assert all("<<" in e.sentence and "[[" in e.sentence for e in ex)


def test_original_files_build_negatives_and_blue_masks():
    d = FIX / "chemprot_development"
    ex = read_chemprot_original(d)
    gold_lines = (d / "chemprot_development_gold_standard.tsv").read_text().splitlines()
    gold = {(f[0], f[2][5:], f[3][5:]): f[1] for f in (ln.split("\t") for ln in gold_lines)}
    by_source = {e.source: e for e in ex}
    # every gold relation of the slice is an example with its class (none crosses a sentence here)
    for (pmid, a1, a2), label in gold.items():
        assert by_source[f"{pmid}:{a1}:{a2}"].label == label
    negatives = [e for e in ex if e.label == "false"]
    assert len(negatives) > len(gold)  # ChemProt is dominated by unrelated pairs
    for e in ex:
        assert e.sentence.count(CHEMICAL_MASK) == 1 and e.sentence.count(GENE_MASK) == 1
        assert "\t" not in e.sentence and "\n" not in e.sentence


def test_sentence_splitter_respects_entities_and_abbreviations():
    text = "We used e.g. aspirin. It binds COX-2. Then A. B. Smith left."
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == ["We used e.g. aspirin.", "It binds COX-2.", "Then A. B. Smith left."]
    protect = [(text.index("aspirin"), text.index("It") + 2)]
    assert len(split_sentences(text, protect)) == 2


def test_nemo_tsv_round_trip_and_errors(tmp_path):
    ex = read_chemprot_original(FIX / "chemprot_development")
    write_nemo_tsv(tmp_path / "dev.tsv", ex)
    back = read_nemo_tsv(tmp_path / "dev.tsv")
    assert [(e.sentence, e.label) for e in back] == [(" ".join(e.sentence.split()), e.label) for e in ex]
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": "INHIBITOR"}\n{"text": "b", "label": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: broken JSON"):
        read_scibert_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "bad.tsv").write_text("a sentence\t7\n")
    with pytest.raises(DataError, match=r"bad\.tsv:1: label id 7"):
        read_nemo_tsv(tmp_path / "bad.tsv")
