"""XML -> JSONL -> vocab -> .bin/.idx, read back by megatron-core and checked against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from transformers import BertTokenizer

from bio_megatron.corpus import shard_worker
from bio_megatron.corpus.tokenize import tokenize_corpus
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.train import train_vocab

VOCABS = Path(__file__).resolve().parents[2] / "bio_megatron" / "resources" / "vocab"
# IndexedDataset is read here in the pytest process, outside any process group: megatron-core's rank-0-only
# logging then warns that it cannot tell the rank. That is this test's doing, not the library's.
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning")


@pytest.fixture(scope="module")
def corpus(sample_jsonl) -> Path:
    """The bundled real sample extracted to one JSONL file (PubMed abstracts then PMC articles): conftest's."""
    return sample_jsonl


def _docs(path: Path) -> list[list[str]]:
    return [[s for s in json.loads(line)["sentences"] if s.strip()] for line in path.read_text().splitlines()]


def _check_against_transformers(prefix: Path, jsonl: Path, vocab: Path, lowercase: bool) -> None:
    ds = IndexedDataset(str(prefix))
    docs = _docs(jsonl)
    hf = BertTokenizer(vocab=str(vocab), do_lower_case=lowercase)
    assert len(hf.get_vocab()) == len(vocab.read_text().splitlines())  # transformers really loaded it
    assert len(ds.document_indices) - 1 == len(docs)
    assert len(ds) == sum(len(d) for d in docs)
    item = 0
    for doc in docs:
        expected = hf(doc, add_special_tokens=False)["input_ids"]
        for ids in expected:
            assert ds[item].dtype == np.int32 and ds[item].tolist() == ids
            item += 1


@pytest.mark.parametrize("vocab_name,lowercase", [("bert_base_cased_vocab.txt", False),
                                                  ("bert_base_uncased_vocab.txt", True)])
def test_indexed_data_equals_independent_wordpiece(tmp_path, corpus, vocab_name, lowercase):
    vocab = VOCABS / vocab_name
    s = tokenize_corpus([corpus], vocab, tmp_path / "pubmed_text_sentence", workers=1, shard_lines=30)
    _check_against_transformers(tmp_path / "pubmed_text_sentence", corpus, vocab, lowercase)
    assert s["lowercase"] is lowercase and s["documents"] == len(_docs(corpus)) and s["tokens"] > 0
    assert 0 <= s["unknown_rate"] < 0.01 and s["tokens_per_s"] > 0
    assert not (tmp_path / "pubmed_text_sentence.shards").exists()


def test_trained_vocab_end_to_end(tmp_path, corpus):
    vocab = tmp_path / "vocab.txt"
    summary = train_vocab(corpus, vocab, size=2000, lowercase=True)
    tokens = vocab.read_text().splitlines()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) == summary["vocab_size"]
    assert len(set(tokens)) == len(tokens) and len(tokens) <= 2000
    assert sum(t.startswith("##") and len(t) > 3 for t in tokens) > 100  # real continuations, not just chars
    s = tokenize_corpus(corpus, vocab, tmp_path / "bio", workers=1)
    _check_against_transformers(tmp_path / "bio", corpus, vocab, lowercase=True)
    assert s["unknown_tokens"] == 0  # every character of the training text is in the vocabulary


def test_worker_count_does_not_change_a_byte(tmp_path, corpus):
    vocab = VOCABS / "bert_base_uncased_vocab.txt"
    for w in (1, 2):
        tokenize_corpus(corpus, vocab, tmp_path / f"w{w}", workers=w, shard_lines=25)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"w1{ext}").read_bytes() == (tmp_path / f"w2{ext}").read_bytes()


def test_interrupted_run_resumes_finished_shards(tmp_path, corpus, monkeypatch):
    vocab = VOCABS / "bert_base_cased_vocab.txt"
    tokenize_corpus(corpus, vocab, tmp_path / "ref", shard_lines=20)
    real = shard_worker.tokenize_shard
    calls: list[int] = []

    def dies_at_shard_3(index, lines, prefix):
        calls.append(index)
        if index == 3:
            raise KeyboardInterrupt  # the user pressed Ctrl-C / the job was preempted
        return real(index, lines, prefix)

    monkeypatch.setattr(shard_worker, "tokenize_shard", dies_at_shard_3)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(corpus, vocab, tmp_path / "run", shard_lines=20)
    assert not (tmp_path / "run.bin").exists() and not (tmp_path / "run.idx").exists()
    calls.clear()
    monkeypatch.setattr(shard_worker, "tokenize_shard", real)
    s = tokenize_corpus(corpus, vocab, tmp_path / "run", shard_lines=20)
    assert s["shards_reused"] == 3 and s["shards"] > 3
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"run{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    # a changed setting invalidates the finished shards instead of mixing two runs
    s2 = tokenize_corpus(corpus, vocab, tmp_path / "run", shard_lines=20, keep_shards=True)
    assert s2["shards_reused"] == 0
    s3 = tokenize_corpus(corpus, vocab, tmp_path / "run", shard_lines=20, lowercase=True)
    assert s3["shards_reused"] == 0 and s3["lowercase"] is True


def test_bad_jsonl_records_are_skipped_and_reported(tmp_path, corpus):
    lines = corpus.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(lines[0] + b'{"id": "x", "source": "pubmed", "sentences": ["caf\xe9"]}\n' + lines[1]
                    + b'{"id": "y", "sentences": \n' + b'{"id": "z", "source": "web", "sentences": []}\n' + lines[2])
    s = tokenize_corpus(bad, VOCABS / "bert_base_cased_vocab.txt", tmp_path / "out")
    assert s["documents"] == 3 and s["skipped_records"] == 3
    assert [p.split(": ", 1)[0] for p in s["problems"]] == [f"{bad}:2", f"{bad}:4", f"{bad}:5"]
    assert "UTF-8" in s["problems"][0] and "JSON" in s["problems"][1] and "source" in s["problems"][2]


def test_fatal_inputs(tmp_path, corpus):
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with pytest.raises(DataError, match="empty.jsonl: empty file"):
        tokenize_corpus(empty, VOCABS / "bert_base_cased_vocab.txt", tmp_path / "o")
    no_mask = tmp_path / "vocab.txt"
    no_mask.write_text("\n".join(t for t in (VOCABS / "bert_base_cased_vocab.txt").read_text().splitlines()
                                 if t != "[MASK]") + "\n")
    with pytest.raises(DataError, match=r"vocab.txt: vocabulary lacks BERT special token\(s\) \[MASK\]"):
        tokenize_corpus(corpus, no_mask, tmp_path / "o")
    assert not (tmp_path / "o.bin").exists()


def test_cli_vocab_train_then_tokenize(tmp_path, corpus, capsys):
    from bio_megatron.cli import main

    vocab = tmp_path / "v.txt"
    assert main(["vocab", "train", "--input", str(corpus), "--output", str(vocab), "--size", "1500",
                 "--uncased", "--threads", "1"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["vocab_size"] == len(vocab.read_text().splitlines()) and trained["lowercase"] is True
    assert main(["data", "tokenize", "--input", str(corpus), "--vocab", str(vocab), "--output-prefix",
                 str(tmp_path / "p"), "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lowercase"] is True  # followed the uncased vocabulary without being told
    assert len(IndexedDataset(str(tmp_path / "p"))) == summary["sentences"]
    assert main(["data", "tokenize", "--input", str(tmp_path / "missing.jsonl"), "--vocab", "bert-base-cased",
                 "--output-prefix", str(tmp_path / "q")]) == 2


_WWM_CHECK = r'''
import sys, warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch.distributed as dist
from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

prefix, vocab, cache = sys.argv[1:4]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # megatron asks the rank
tok = WordPieceTokenizer(vocab)
cfg = BERTMaskedWordPieceDatasetConfig(
    random_seed=1, sequence_length=64, blend=([prefix], None), split="100,0,0", path_to_cache=cache,
    tokenizer=tok, masking_probability=0.15, short_sequence_probability=0.1, masking_max_ngram=3,
    masking_do_full_word=True, masking_do_permutation=False, masking_use_longer_ngrams=False,
    masking_use_geometric_distribution=False, classification_head=False)
train = BlendedMegatronDatasetBuilder(BERTMaskedWordPieceDataset, [300, 0, 0], lambda: True, cfg).build()[0]
split_words = masked_continuations = 0
for i in range(len(train)):
    x = train[i]
    lm, txt, lab = x["loss_mask"], x["text"], x["labels"]
    for p in np.nonzero(lm)[0]:
        if tok.inv_vocab[int(lab[p])].startswith("##"):
            masked_continuations += 1
            if lm[p - 1] == 0 and int(txt[p - 1]) not in (tok.cls, tok.sep):
                split_words += 1  # a continuation masked without its word start
        q = p + 1
        if q < len(lm) and lm[q] == 0 and tok.inv_vocab[int(txt[q])].startswith("##"):
            split_words += 1  # a word start masked, its continuation left visible
print("RESULT", split_words, masked_continuations)
'''


def test_megatron_whole_word_masking_on_trained_vocab(tmp_path, corpus):
    """megatron-core's BERT dataset, fed our trained vocab and .bin/.idx, masks whole words only."""
    import os
    import subprocess
    import sys

    vocab = tmp_path / "v.txt"
    train_vocab(corpus, vocab, size=2000, lowercase=True)
    tokenize_corpus(corpus, vocab, tmp_path / "bio")
    script = tmp_path / "wwm.py"
    script.write_text(_WWM_CHECK)
    # its own process: a gloo process group in the pytest process would leak into other tests
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(VOCABS.parents[2])}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "bio"), str(vocab), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    split_words, masked_continuations = map(int, out.stdout.split("RESULT")[1].split())
    assert masked_continuations > 50  # '##' pieces exist and were masked as parts of words
    assert split_words == 0
