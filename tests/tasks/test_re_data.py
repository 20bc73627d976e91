"""ChemProt readers: SciBERT JSONL, the original BioCreative VI files (negatives, anonymisation), NeMo tsv;
the example counts of the full original release against BLUE's own script (``../shared``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.tasks.re_data import (CHEMICAL_MASK, GENE_MASK, OVERLAP_MASK, chemprot_sentences,
                                        read_chemprot_original, read_nemo_tsv, read_scibert_jsonl, split_sentences,
                                        write_nemo_tsv)
from bio_megatron.utils.errors import DataError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "re"
ORIGINAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "re" / "chemprot-original"


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
        masks = (e.sentence.count(CHEMICAL_MASK), e.sentence.count(GENE_MASK), e.sentence.count(OVERLAP_MASK))
        assert masks in ((1, 1, 0), (0, 0, 1))  # a pair, or BLUE's one mask over overlapping mentions
        assert "\t" not in e.sentence and "\n" not in e.sentence


def test_overlapping_mentions_and_two_class_pairs_as_blue(tmp_path):
    # A chemical inside a gene name ("ATP" in "ATP synthase") is one BLUE example masked @CHEM-GENE$; a pair with
    # two gold classes is two examples (BLUE writes one row per gold line); a relation across a sentence is lost.
    text = "ATP synthase is inhibited by oligomycin. Aspirin acts on COX-1."
    ents = [("T1", "CHEMICAL", "ATP"), ("T2", "GENE-N", "ATP synthase"), ("T3", "CHEMICAL", "oligomycin"),
            ("T4", "CHEMICAL", "Aspirin"), ("T5", "GENE-Y", "COX-1")]
    (tmp_path / "x_abstracts.tsv").write_text(f"1\t{text[:12]}\t{text[13:]}\n")
    rows = [f"1\t{t}\t{kind}\t{text.index(name)}\t{text.index(name) + len(name)}\t{name}" for t, kind, name in ents]
    (tmp_path / "x_entities.tsv").write_text("\n".join(rows) + "\n")
    gold = ["1\tCPR:4\tArg1:T3\tArg2:T2", "1\tCPR:3\tArg1:T3\tArg2:T2", "1\tCPR:4\tArg1:T4\tArg2:T2"]
    (tmp_path / "x_gold_standard.tsv").write_text("\n".join(gold) + "\n")
    ex = read_chemprot_original(tmp_path)
    got = sorted((e.source, e.label, e.sentence) for e in ex)
    assert got == [
        ("1:T1:T2", "false", "@CHEM-GENE$ is inhibited by oligomycin."),
        ("1:T3:T2", "CPR:3", "@GENE$ is inhibited by @CHEMICAL$."),
        ("1:T3:T2", "CPR:4", "@GENE$ is inhibited by @CHEMICAL$."),
        ("1:T4:T5", "false", "@CHEMICAL$ acts on @GENE$."),
    ]


def test_chemprot_sentences_end_where_blue_can():
    text = ("It binds nAChR. Then 5-HT rose. A gain of 40 nM. (See above.) Levels of IL-6. More in vitro. "
            "The end")
    spans = [text[s:e] for s, e in chemprot_sentences(text)]
    # no end after a symbol like nAChR., before a digit or a bracket, nor after a bracket (BLUE keeps a sentence
    # end only after . ! ?); an end after "rose.", "IL-6." and "vitro."
    assert spans == ["It binds nAChR. Then 5-HT rose.", "A gain of 40 nM. (See above.) Levels of IL-6.",
                     "More in vitro.", "The end"]


# BLUE's create_chemprot_bert.py on the same files: 19,019 lines of train.tsv, a header included (BLUE_Benchmark
# issue #17, 2022); its release's train.tsv has 19,461 lines. Re-run here with spaCy 3.8.18 / en_core_web_sm
# 3.8.0, its pairing gives 19,258 / 11,908 / 16,760 (train / development / test). Ours before this reader
# followed BLUE: 16,778 / 10,609 / 14,598.
BLUE_SCRIPT_TRAIN = 19_019 - 1
OURS = {"chemprot_training": (19_189, 4_156), "chemprot_development": (11_894, 2_416),
        "chemprot_test_gs": (16_618, 3_458)}


@pytest.mark.skipif(not ORIGINAL.is_dir(), reason=f"the original ChemProt release is not at {ORIGINAL}")
@pytest.mark.parametrize("split", list(OURS))
def test_original_release_counts_match_blue_script(split):
    ex = read_chemprot_original(ORIGINAL / split)
    gold_lines = next((ORIGINAL / split).glob("*_gold_standard*.tsv")).read_text().splitlines()
    positives = sum(e.label != "false" for e in ex)
    assert (len(ex), positives) == OURS[split]
    assert len(gold_lines) - positives <= 1  # one training relation spans two sentences; BLUE loses it too
    if split == "chemprot_training":
        assert abs(len(ex) - BLUE_SCRIPT_TRAIN) / BLUE_SCRIPT_TRAIN < 0.01


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
    # NeMo's own files open with the header its import scripts write (its reader drops line 1): read past it, and
    # only there (a header-like line later is still a bad line)
    (tmp_path / "nemo.tsv").write_text("sentence\tlabel\n" + (tmp_path / "dev.tsv").read_text())
    assert [(e.sentence, e.label) for e in read_nemo_tsv(tmp_path / "nemo.tsv")] == [(e.sentence, e.label) for e in back]
    (tmp_path / "late.tsv").write_text("a sentence\t0\nsentence\tlabel\n")
    with pytest.raises(DataError, match=r"late\.tsv:2: expected 'sentence<TAB>int_label'"):
        read_nemo_tsv(tmp_path / "late.tsv")
