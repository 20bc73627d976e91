"""flash-tokenizer in front of the Rust WordPiece: the same ids as ``tokenizers`` on every text we can find.

The outside truth is ``tokenizers`` (the reference encoder, itself checked against BERT's original algorithm by
``bench data``). Texts: the bundled corpus (always), the NER / BLURB / ChemProt / PubMedQA / SQuAD texts in
``../shared`` (skipped when absent; every 25th text in the default run, all of them in the slow test), and strings
chosen to break a WordPiece (accents, CJK, control characters, special-token look-alikes, 100+ character words).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("flash_tokenizer", reason="flash-tokenizer has wheels for x86-64 Linux only")

from bio_megatron.corpus.fast_encode import HybridEncoder, fast_encoder, flash_safe  # noqa: E402
from bio_megatron.vocab.wordpiece import WordPieceTokenizer  # noqa: E402

VOCABS = Path(__file__).resolve().parents[2] / "bio_megatron" / "resources" / "vocab"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CASES = {"uncased": True, "cased": False}
ADVERSARIAL = [
    "Café naïve résumé Ångström", "中文字符 and 日本語", "ctrl\x00char\x01 and\ttab\nnewline\r", "[SEP] [CLS] [MASK] [UNK]",
    "a" * 150 + " word", "x" * 99 + "y z", "(" + "b" * 120 + ")", "emoji 😀🧬 test", "zero\u200bwidth", "combining e\u0301",
    "Ｆｕｌｌｗｉｄｔｈ", "ﬁ ligature", "", "   ", "µg/mL α-β γ", "\u00ad soft hyphen", "\ufeffBOM", "İstanbul ß ẞ",
    "fitness 〈f〉 can", "PI3K\ue232AKT", "Code §622 stated", "1 mg⁄kg", "a\u0000b", "tab\u3000space", "x\x7fy",
]


def _encoders(case: str) -> tuple[WordPieceTokenizer, HybridEncoder]:
    tok = WordPieceTokenizer(VOCABS / f"bert_base_{case}_vocab.txt", CASES[case])
    enc = fast_encoder(tok)
    assert isinstance(enc, HybridEncoder)
    return tok, enc


def _assert_same_ids(texts: list[str], case: str) -> None:
    tok, enc = _encoders(case)
    want, got = tok.tokenize_batch(texts), enc.tokenize_batch(texts)
    bad = [t for t, w, g in zip(texts, want, got) if w != g]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ ({case}), e.g. {bad[0][:120]!r}"


@pytest.fixture(scope="module")
def corpus_sentences(sample_jsonl) -> list[str]:
    return [s for line in sample_jsonl.read_text().splitlines() for s in json.loads(line)["sentences"]]


@pytest.fixture(scope="module")
def shared_texts() -> list[str]:
    return _shared_texts()


def _shared_texts() -> list[str]:
    """Sentences and passages of every task dataset in ../shared (IOB files rejoined into sentences)."""
    texts: list[str] = []
    csv.field_size_limit(sys.maxsize)
    iob = [*SHARED.glob("ner/*/*.tsv"), *SHARED.glob("blurb/JNLPBA/*.tsv"), *SHARED.glob("blurb/EBM_PICO/*.tsv")]
    for f in sorted(iob):
        words: list[str] = []
        for line in f.read_text(encoding="utf-8").splitlines():
            first = line.split("\t")[0]
            if first and not first.startswith("-DOCSTART-") and "\t" in line:
                words.append(first)
            elif words:
                texts.append(" ".join(words))
                words = []
    rows = [*SHARED.glob("blurb/*/*.tsv"), *SHARED.glob("re/*/*.txt"), *SHARED.glob("re/chemprot-original/*/*abstracts*")]
    for f in sorted(set(rows) - set(iob)):
        for line in f.read_text(encoding="utf-8").splitlines():
            texts.extend(x for x in line.split("\t") if len(x) > 20)
    pqa = SHARED / "blurb" / "PubMedQA" / "ori_pqal.json"
    if pqa.is_file():
        for v in json.loads(pqa.read_text()).values():
            texts += [v["QUESTION"], *v["CONTEXTS"], v.get("LONG_ANSWER", "")]
    for f in SHARED.glob("qa/squad-v2/*.json"):
        for art in json.loads(f.read_text())["data"]:
            for p in art["paragraphs"]:
                texts += [p["context"], *(q["question"] for q in p["qas"])]
    return texts


@pytest.mark.parametrize("case", sorted(CASES))
def test_bundled_corpus_ids_equal_tokenizers(corpus_sentences, case):
    assert len(corpus_sentences) > 1000
    _assert_same_ids(corpus_sentences, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_adversarial_strings_equal_and_routing_is_needed(case):
    _assert_same_ids(ADVERSARIAL, case)
    # Without the routing flash-tokenizer alone differs on some of them: the fallback is not decoration.
    tok, enc = _encoders(case)
    alone = [enc._flash.encode(t, "longest", -1)[1:-1] for t in ADVERSARIAL]
    assert alone != tok.tokenize_batch(ADVERSARIAL)
    assert not flash_safe("a" * 150) and not flash_safe("Café") and flash_safe("IL-2 (p < 0.05).")


@pytest.mark.skipif(not (SHARED / "ner").is_dir(), reason=f"task datasets not found under {SHARED}")
@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_task_texts_sample_equal(shared_texts, case):
    assert len(shared_texts) > 100_000
    _assert_same_ids(shared_texts[::25], case)


@pytest.mark.slow
@pytest.mark.extended  # every text, ~75 s on 2 cores (the default run checks every 25th): make test-extended
@pytest.mark.skipif(not (SHARED / "ner").is_dir(), reason=f"task datasets not found under {SHARED}")
@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_task_texts_all_equal(shared_texts, case):
    _assert_same_ids(shared_texts, case)


def test_tokenizers_choice_and_bpe_use_the_reference(tmp_path):
    tok = WordPieceTokenizer(VOCABS / "bert_base_uncased_vocab.txt", True)
    assert fast_encoder(tok, "tokenizers") is tok
    with pytest.raises(ValueError, match="encoder must be one of"):
        fast_encoder(tok, "flash")
