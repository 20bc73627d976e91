"""BLURB readers on the synthetic fixtures and on the real splits in ../shared (counts from SOURCES.md/BLURB)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bio_megatron.tasks.blurb_data import (read_bioasq_yesno, read_biosses, read_ddi, read_gad, read_hoc,
                                           read_pmid_list, read_pubmedqa, read_pubmedqa_labels)
from bio_megatron.tasks.blurb_tagging import read_ebm_pico, read_jnlpba, sentences_of
from bio_megatron.utils.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "blurb"
BLURB = ROOT.parent / "shared" / "data" / "blurb"
needs_shared = pytest.mark.skipif(not (BLURB / "HoC" / "SOURCES.md").is_file(),
                                  reason="needs ../shared/data/blurb (GPL-3.0 / CC BY-NC data is not in the project)")


def test_fixture_readers():
    pq = read_pubmedqa(FIX / "PubMedQA/test_set.json", FIX / "PubMedQA/test_ground_truth.json")
    assert [(e.id, e.label) for e in pq][:2] == [("90000011", "yes"), ("90000012", "no")]
    assert pq[0].text.startswith("Does drug X") and pq[0].text_b.endswith("3 days with placebo.")
    assert read_pubmedqa_labels(FIX / "PubMedQA/test_set.json") == read_pubmedqa_labels(
        FIX / "PubMedQA/test_ground_truth.json")
    yn = read_bioasq_yesno(FIX / "BioASQ/yesno_golden.json")  # the factoid and summary questions are skipped
    assert [e.label for e in yn] == ["yes", "no", "yes"] and yn[0].text == "Is protein K1 a kinase?"
    assert yn[0].text_b == "K1 phosphorylates its substrates on serine. The kinase domain of K1 was crystallised."
    ddi = read_ddi(FIX / "DDI/test.tsv")
    assert len(ddi) == 8 and ddi[0].id == "DDI-DrugBank.d901.s0.p0" and ddi[0].label == "DDI-mechanism"
    assert [e.label for e in read_gad(FIX / "GAD/test.tsv")] == ["1", "0", "1", "0", "1", "0"]
    b = read_biosses(FIX / "BIOSSES/test.tsv")
    assert [(e.id, e.score) for e in b][-1] == ("44", 4.0) and b[0].text_b.startswith("Resting cells")
    hoc = read_hoc(FIX / "HoC/test.tsv", FIX / "HoC/test_pmid.tsv")
    assert [e.doc_id for e in hoc] == ["9000001"] * 3 + ["9000002"] * 2 + ["9000003"] * 2
    assert hoc[5].labels == frozenset({5, 7}) and hoc[0].labels == frozenset()
    ebm = read_ebm_pico(FIX / "EBM_PICO/test.tsv", FIX / "EBM_PICO/test_pmid.tsv")
    assert [d.id for d in ebm] == ["91000001", "91000002"] and ebm[0].line == 1
    assert ebm[0].sentences[0].tags[:4] == ["I-INT", "I-INT", "O", "I-PAR"]
    jn = read_jnlpba(FIX / "JNLPBA/test.tsv")
    assert [len(d.sentences) for d in jn] == [2, 1] and sentences_of(jn)[2].words[1] == "c-myc"


def test_bad_gold_files_name_file_and_line(tmp_path):
    def refused(reader, text: str, *needles: str, name: str = "f.tsv", **kw) -> None:
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(DataError) as exc:
            reader(f, **kw)
        for needle in needles:
            assert needle in str(exc.value), (needle, str(exc.value))

    refused(read_ddi, "a\tx\tDDI-false\nb\ty\tDDI-other\n", "f.tsv:2:", "'DDI-other'")
    refused(read_ddi, "a\tx\tDDI-false\na\ty\tDDI-int\n", "f.tsv:2:", "already used on line 1")
    refused(read_gad, "index\tsentence\tlabel\n", "no records")  # a header alone is nothing to score
    refused(read_gad, "id\ttext\tlabel\n0\tx\t1\n", "f.tsv:1:", "header")
    refused(read_biosses, "pair_id\tsent1\tsent2\tscore\n1\ta\tb\thigh\n", "f.tsv:2:", "not a number")
    refused(read_hoc, "labels\tsentence\tindex\n0_1,1_0\tx\t1_s0\n", "f.tsv:2:", "each of 0_v")
    (tmp_path / "pmids.tsv").write_text("1.txt,2.txt\n")
    refused(read_hoc, "labels\tsentence\tindex\n" + ",".join(f"{i}_0" for i in range(10)) + "\tx\t1_s0\n",
            "have no record", "'2'", pmids=tmp_path / "pmids.tsv")
    refused(read_jnlpba, "IL-2\tB\n", "f.tsv:1:", "-DOCSTART-")
    refused(read_jnlpba, "-DOCSTART- 1\n\nIL-2\tB-protein\n", "f.tsv:3:", "B-protein")  # typed: not BLURB's
    refused(read_ebm_pico, "-DOCSTART- (1)\n\nx\tI-PAR\n\n-DOCSTART- (2)\n\n", "f.tsv:5:", "document 2 has no token")
    refused(read_pubmedqa, json.dumps({"1": {"QUESTION": "q?", "CONTEXTS": ["c"], "final_decision": "perhaps"}}),
            "f.json:1:", "'perhaps'", name="f.json")
    golden = {"questions": [{"id": "q1", "type": "yesno", "body": "b", "snippets": [], "exact_answer": ["yes"]}]}
    refused(read_bioasq_yesno, json.dumps(golden, indent=1), "f.json:4:", "exact_answer", name="f.json")
    golden["questions"][0]["type"] = "factoid"
    refused(read_bioasq_yesno, json.dumps(golden), "no yes/no question", name="f.json")


# (file, records, label counts) as stated in each dataset's SOURCES.md, which checks them against BLURB's table.
_COUNTS = {
    ("DDI", "train"): (25296, {"DDI-false": 21745, "DDI-advise": 725, "DDI-effect": 1486, "DDI-int": 177,
                               "DDI-mechanism": 1163}),
    ("DDI", "dev"): (2496, {"DDI-false": 2027, "DDI-advise": 101, "DDI-effect": 201, "DDI-int": 11,
                            "DDI-mechanism": 156}),
    ("DDI", "test"): (5716, {"DDI-false": 4737, "DDI-advise": 221, "DDI-effect": 360, "DDI-int": 96,
                             "DDI-mechanism": 302}),
    ("GAD", "train"): (4261, {"1": 2227, "0": 2034}),
    ("GAD", "dev"): (535, {"1": 293, "0": 242}),
    ("GAD", "test"): (534, {"1": 281, "0": 253}),
}


@needs_shared
@pytest.mark.parametrize("dataset,split", sorted(_COUNTS))
def test_real_classification_splits(dataset, split):
    examples = (read_ddi if dataset == "DDI" else read_gad)(BLURB / dataset / f"{split}.tsv")
    n, labels = _COUNTS[dataset, split]
    assert len(examples) == n and Counter(e.label for e in examples) == labels


@needs_shared
def test_real_biosses_pubmedqa_hoc():
    assert [len(read_biosses(BLURB / "BIOSSES" / f"{s}.tsv")) for s in ("train", "dev", "test")] == [64, 16, 20]
    pq = BLURB / "PubMedQA"
    for path, counts in ((pq / "pqal_fold0/train_set.json", (249, 152, 49)), (pq / "pqal_fold0/dev_set.json",
                         (27, 17, 6)), (pq / "test_set.json", (276, 169, 55)), (pq / "ori_pqal.json", (552, 338, 110))):
        c = Counter(e.label for e in read_pubmedqa(path))
        assert (c["yes"], c["no"], c["maybe"]) == counts, path
    test = read_pubmedqa(pq / "test_set.json", pq / "test_ground_truth.json")
    assert {e.id: e.label for e in test} == read_pubmedqa_labels(pq / "test_ground_truth.json")
    positives = {"train": [201, 86, 68, 87, 169, 222, 101, 309, 315, 180],
                 "dev": [28, 8, 18, 4, 18, 46, 19, 41, 42, 20], "test": [62, 14, 19, 24, 53, 65, 23, 79, 105, 40]}
    for split, (n_sent, n_doc, n_empty) in {"train": (12119, 1295, 197), "dev": (1798, 186, 22),
                                            "test": (3547, 371, 53)}.items():
        hoc = read_hoc(BLURB / "HoC" / f"{split}.tsv", BLURB / "HoC" / f"{split}_pmid.tsv")
        docs: dict[str, set[int]] = {}
        for e in hoc:
            docs.setdefault(e.doc_id, set()).update(e.labels)
        assert (len(hoc), len(docs), sum(not v for v in docs.values())) == (n_sent, n_doc, n_empty)
        assert [sum(i in v for v in docs.values()) for i in range(10)] == positives[split]


@needs_shared
def test_real_tagging_splits():
    # JNLPBA: BLURB's table counts entities (B tags): 46,750 / 4,551 / 8,662.
    for split, (n_doc, n_tok, n_ent) in {"train": (1800, 445090, 46750), "dev": (200, 47461, 4551),
                                         "test": (404, 101039, 8662)}.items():
        docs = read_jnlpba(BLURB / "JNLPBA" / f"{split}.tsv")
        tags = [t for s in sentences_of(docs) for t in s.tags]
        assert (len(docs), len(tags), tags.count("B")) == (n_doc, n_tok, n_ent)
        assert len({d.id for d in docs}) == n_doc  # repeated PMIDs get #2 ids
    # EBM PICO: BLURB's test count (16,364) is the number of non-O words.
    for split, counts in {"dev": (960, 25061, 31967, 30280, 174960), "test": (191, 3563, 8090, 4711, 35420)}.items():
        docs = read_ebm_pico(BLURB / "EBM_PICO" / f"{split}.tsv", BLURB / "EBM_PICO" / f"{split}_pmid.tsv")
        c = Counter(t for s in sentences_of(docs) for t in s.tags)
        assert (len(docs), c["I-INT"], c["I-OUT"], c["I-PAR"], c["O"]) == counts
    assert len(read_pmid_list(BLURB / "EBM_PICO" / "train_pmid.tsv")) == 3842
