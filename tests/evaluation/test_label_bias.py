"""Label bias (paper Table 8): hand cases, the paper's own figures, sub-token counts against the training
alignment and Hugging Face's WordPiece, real ChemProt/SQuAD slices in every input format, the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bio_megatron.cli import main
from bio_megatron.evaluation.label_bias import classification_label_bias, ner_label_bias, qa_label_bias
from bio_megatron.tasks.ner_data import Sentence, build_label_map, encode_sentences, read_iob
from bio_megatron.tasks.qa_data import QAExample, read_squad
from bio_megatron.tasks.re_data import read_relations, write_nemo_tsv
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VOCAB = Path(__file__).resolve().parents[2] / "bio_megatron/resources/vocab/bert_base_cased_vocab.txt"
CHEM = FIX / "ner/bc5cdr_chem_devel_head.tsv"


def test_ner_word_level_hand_case():
    sents = [Sentence(["Aspirin", "induced", "renal", "failure", "."], ["B-Chemical", "O", "B-Disease", "I-Disease", "O"]),
             Sentence(["No", "effect"], ["O", "O"])]
    r = ner_label_bias(sents)
    # 3 minority tags (B-Chemical, B-Disease, I-Disease) over 4 O tags
    assert (r["samples"], r["majority_label"], r["minority_count"], r["majority_count"]) == (2, "O", 3, 4)
    assert r["label_bias"] == pytest.approx(0.75) and r["unit"] == "word"


def test_majority_ties_and_empty_input():
    r = classification_label_bias(["b", "a", "b", "a"])
    assert (r["majority_label"], r["label_bias"]) == ("a", 1.0)  # tie: first name, ratio 1 either way
    with pytest.raises(DataError, match="no labels"):
        classification_label_bias([])


def test_paper_figures_where_the_counts_are_public():
    # MRPC train (GLUE): 3,668 pairs, 2,474 paraphrases; Table 8 prints 3668 / 0.48
    mrpc = classification_label_bias(["1"] * 2474 + ["0"] * 1194)
    assert (mrpc["samples"], round(mrpc["label_bias"], 2)) == (3668, 0.48)
    # ChemProt: 19,461 samples with the 4,157 gold relations of the BioCreative VI training set
    # (chemprot_training_gold_standard.tsv has 4,157 lines) as minority; Table 8 prints 19461 / 0.27
    cpr = classification_label_bias(["CPR:4"] * 4157 + ["false"] * (19461 - 4157))
    assert (cpr["samples"], round(cpr["label_bias"], 2), cpr["majority_label"]) == (19461, 0.27, "false")


def test_subtoken_counts_equal_the_training_alignment_and_hf_wordpiece():
    import transformers
    sents = read_iob(CHEM)
    tok = WordPieceTokenizer(VOCAB)
    label_map = build_label_map(sents)
    names = {i: t for t, i in label_map.items()}
    word = ner_label_bias(sents)
    for ignore_extra in (False, True):
        r = ner_label_bias(sents, tok, ignore_extra_tokens=ignore_extra)
        feats = encode_sentences(sents, tok, label_map, max_seq_length=4096, ignore_extra_tokens=ignore_extra)
        seen_by_loss = Counter(names[i] for f in feats for i in f.labels if i >= 0)
        assert r["label_counts"] == dict(sorted(seen_by_loss.items()))
    assert ner_label_bias(sents, tok, ignore_extra_tokens=True)["label_counts"] == word["label_counts"]
    # outside truth for the sub-token counts: Hugging Face's own WordPiece on every word
    hf = transformers.BertTokenizer(vocab=str(VOCAB), do_lower_case=False)  # transformers 5: vocab=, not vocab_file=
    expected = Counter()
    for s in sents:
        for w, t in zip(s.words, s.tags):
            expected[t] += len(hf.tokenize(w))
    sub = ner_label_bias(sents, tok)
    assert sub["label_counts"] == dict(sorted(expected.items()))
    # chemical names break into more pieces than ordinary words (paper Table 3), so sub-token bias is higher
    assert sub["label_bias"] > word["label_bias"]


def test_qa_repeats_of_question_answer_combinations():
    ex = [QAExample(f"q1_{i:03d}", "Which gene  is mutated?", f"snippet {i}", [{"text": "BRCA1", "answer_start": 0}])
          for i in range(3)]
    ex += [QAExample("q2_001", "Which gene is mutated?", "other", [{"text": "TP53", "answer_start": 0}]),
           QAExample("q3", "Unanswerable?", "ctx", [], is_impossible=True)]
    r = qa_label_bias(ex)
    # BioASQ-style: q1 repeats over three snippets (whitespace runs collapsed); same question, other answer
    # is another combination; the unanswerable question is left out
    assert (r["min_repeat"], r["max_repeat"], r["combinations"], r["unanswerable"], r["samples"]) == (1, 3, 2, 1, 5)
    assert r["label_bias"] == pytest.approx(1 / 3) and r["most_repeated"]["answer"] == "BRCA1"
    with pytest.raises(DataError, match="no answered"):
        qa_label_bias(ex[-1:])


def test_qa_on_real_squad_v2_slice():
    raw = json.loads((FIX / "qa/squad_v2_dev_slice.json").read_text())
    qas = [q for a in raw["data"] for p in a["paragraphs"] for q in p["qas"]]
    r = qa_label_bias(read_squad(FIX / "qa/squad_v2_dev_slice.json"))
    assert r["samples"] == len(qas) and r["unanswerable"] == sum(q["is_impossible"] for q in qas)
    assert r["label_bias"] == r["min_repeat"] / r["max_repeat"]


def test_re_formats_agree_on_real_chemprot(tmp_path):
    directory = FIX / "re/chemprot_development"
    examples = read_relations(directory)  # auto: the original release
    write_nemo_tsv(tmp_path / "dev.tsv", examples)
    a = classification_label_bias(ex.label for ex in examples)
    b = classification_label_bias(ex.label for ex in read_relations(tmp_path / "dev.tsv"))  # auto: NeMo tsv
    assert a == b and a["majority_label"] == "false" and 0 < a["label_bias"] < 1
    sci = read_relations(FIX / "re/chemprot_scibert_dev_head.jsonl")  # auto: SciBERT JSON lines
    assert len(sci) == 40 and {ex.label for ex in sci} <= {"CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"}


def _cli(capsys, caplog, argv):
    caplog.clear()
    rc = main(argv)
    return rc, capsys.readouterr().out, caplog.text  # errors go through the one logger


def test_cli_json_markdown_and_errors(capsys, caplog, tmp_path):
    rc, out, _ = _cli(capsys, caplog, ["analyse", "label-bias", "ner", str(CHEM), "--vocab", str(VOCAB)])
    report = json.loads(out)
    assert rc == 0 and report["files"][str(CHEM)] == ner_label_bias(read_iob(CHEM), WordPieceTokenizer(VOCAB))
    rc, out, _ = _cli(capsys, caplog, ["analyse", "label-bias", "re", str(FIX / "re/chemprot_development"), "--format", "markdown"])
    assert rc == 0 and out.splitlines()[0] == "| Task | Dataset | # Samples | Bias |"
    assert out.splitlines()[2].startswith(f"| RE | {FIX / 're/chemprot_development'} | ")
    rc, out, err = _cli(capsys, caplog, ["analyse", "label-bias", "re", str(CHEM), "--vocab", str(VOCAB)])
    assert rc == 2 and out == "" and "--vocab" in err
    (tmp_path / "bad.tsv").write_text("aspirin\tB-Chemical\nworks\n")
    rc, out, err = _cli(capsys, caplog, ["analyse", "label-bias", "ner", str(tmp_path / "bad.tsv")])
    assert rc == 2 and out == "" and f"{tmp_path / 'bad.tsv'}:2" in err
    (tmp_path / "none.json").write_text('{"data": []}')
    rc, out, err = _cli(capsys, caplog, ["analyse", "label-bias", "qa", str(tmp_path / "none.json")])
    assert rc == 2 and out == "" and f"{tmp_path / 'none.json'}: no answered questions" in err
