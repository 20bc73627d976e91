"""Our numpy ``.bin/.idx`` writer against megatron-core's own builder and reader (no torch in the writer)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from bio_megatron.corpus.indexed import IndexedWriter, read_index

# IndexedDataset is read here in the pytest process, outside any process group: megatron-core's rank-0-only
# logging then warns that it cannot tell the rank. That is this test's doing, not the library's.
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank:UserWarning")


def _documents(shape: str, rng: np.random.Generator) -> list[list[list[int]]]:
    """Documents as lists of sentences of token ids, in the shapes the tokenizer produces."""
    if shape == "one_sentence":
        return [[[7]]]
    if shape == "one_document":
        return [[rng.integers(0, 30_000, n).tolist() for n in (5, 1, 40)]]
    if shape == "many":
        return [[rng.integers(0, 30_000, int(n)).tolist() for n in rng.integers(1, 60, int(k))]
                for k in rng.integers(1, 12, 300)]
    if shape == "large_ids":  # int32 ids beyond 16 bits (BPE / large vocabularies)
        return [[[2**31 - 1, 65_536, 0]], [[123_456] * 3, [1]]]
    raise ValueError(shape)


SHAPES = ["one_sentence", "one_document", "many", "large_ids"]


def _megatron_files(tmp_path, docs) -> tuple[bytes, bytes]:
    builder = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.int32)
    for doc in docs:
        builder.add_document(np.array([t for s in doc for t in s], np.int64), [len(s) for s in doc])
    builder.finalize(str(tmp_path / "ref.idx"))
    return (tmp_path / "ref.bin").read_bytes(), (tmp_path / "ref.idx").read_bytes()


@pytest.mark.parametrize("shape", SHAPES)
def test_bytes_equal_megatron_builder_and_reader_reads_them(tmp_path, shape):
    docs = _documents(shape, np.random.default_rng(0))
    ref_bin, ref_idx = _megatron_files(tmp_path, docs)
    w = IndexedWriter(tmp_path / "ours.bin")
    for doc in docs:
        w.add_document(np.array([t for s in doc for t in s], np.int32), [len(s) for s in doc])
    w.finalize(tmp_path / "ours.idx")
    assert (tmp_path / "ours.idx").read_bytes() == ref_idx
    assert (tmp_path / "ours.bin").read_bytes() == ref_bin

    ds = IndexedDataset(str(tmp_path / "ours"))
    assert len(ds) == sum(len(d) for d in docs) and len(ds.document_indices) == len(docs) + 1
    sents = [s for d in docs for s in d]
    assert all(ds[i].dtype == np.int32 and ds[i].tolist() == s for i, s in enumerate(sents))


def test_concatenated_shards_equal_one_megatron_build(tmp_path):
    """``add_index`` of shards written by us gives the builder's bytes for all documents at once."""
    docs = _documents("many", np.random.default_rng(1))
    ref_bin, ref_idx = _megatron_files(tmp_path, docs)
    cuts = [0, 1, 100, 101, 250, len(docs)]  # shards of one document, many, and the rest
    for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
        w = IndexedWriter(tmp_path / f"shard{k}.bin")
        for doc in docs[a:b]:
            w.add_document(np.array([t for s in doc for t in s], np.int32), [len(s) for s in doc])
        w.finalize(tmp_path / f"shard{k}.idx")
        lengths, ends, dtype = read_index(tmp_path / f"shard{k}.idx")
        assert dtype is np.int32 and ends[0] == 0 and len(ends) == b - a + 1 and lengths.sum() > 0
    whole = IndexedWriter(tmp_path / "whole.bin")
    for k in range(len(cuts) - 1):
        whole.add_index(tmp_path / f"shard{k}")
    whole.finalize(tmp_path / "whole.idx")
    assert (tmp_path / "whole.idx").read_bytes() == ref_idx
    assert (tmp_path / "whole.bin").read_bytes() == ref_bin


def test_empty_dataset_matches_megatron(tmp_path):
    _, ref_idx = _megatron_files(tmp_path, [])
    w = IndexedWriter(tmp_path / "ours.bin")
    w.finalize(tmp_path / "ours.idx")
    assert (tmp_path / "ours.idx").read_bytes() == ref_idx


def test_read_index_rejects_other_files(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"PK\x03\x04" + bytes(40))  # e.g. an old np.savez shard index
    with pytest.raises(ValueError, match="not a megatron indexed-dataset index"):
        read_index(tmp_path / "x.idx")


# --- `data tokenize` itself: the same bytes as before the numpy writer, and no torch in its process ---
# sha256 of the outputs of the megatron-IndexedDatasetBuilder version of `data tokenize` (2026-11-23), on
# the bundled sample extracted by `data pubmed` + `data pmc`, workers=1, shard_lines=30.
_INPUT_SHA256 = "fbade7ec960aea0de5e3e0b35d537386bec6e5c81cb2e0be81a30df2276d9d52"
_GOLDEN = {
    "uncased": ("1c4a9f569d5a5be30f8e2ff73bd421eb53662bccd510b9616b83a9c7bb65d3f8",
                "b1c72908454900a966e4899632c7dc6b46177c108d4a25b13d5e3c4ba324b9c3"),
    "cased": ("c9c4e312fc87d3537bc7d25e2581ce191938de1b94533fbba030711fb1239c79",
              "d711d69798b01d1155a78a1feba4594bacb855a9d71ce75b4eca3cd50f81eab8"),
}
VOCABS = Path(__file__).resolve().parents[2] / "bio_megatron" / "resources" / "vocab"


@pytest.mark.parametrize("case", sorted(_GOLDEN))
def test_tokenize_output_unchanged_sha256(tmp_path, sample_jsonl, case):
    from bio_megatron.corpus.tokenize import tokenize_corpus

    # If this fails, extraction changed (not tokenization): recompute the golden hashes from a known-good run.
    assert hashlib.sha256(sample_jsonl.read_bytes()).hexdigest() == _INPUT_SHA256, "the extracted sample changed"
    tokenize_corpus(sample_jsonl, VOCABS / f"bert_base_{case}_vocab.txt", tmp_path / case, workers=1, shard_lines=30)
    got = tuple(hashlib.sha256((tmp_path / f"{case}{ext}").read_bytes()).hexdigest() for ext in (".bin", ".idx"))
    assert got == _GOLDEN[case]


def test_data_tokenize_never_imports_torch_or_megatron(tmp_path, sample_jsonl):
    """A whole `data tokenize` run (2 workers) in a fresh interpreter: torch/megatron never loaded."""
    code = ("import sys, json; from bio_megatron.cli import main; rc = main(sys.argv[1:]); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')); "
            "sys.stderr.write('LOADED=' + json.dumps(bad) + '\\n'); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "data", "tokenize", "--input", str(sample_jsonl),
                           "--vocab", "bert-base-uncased", "--output-prefix", str(tmp_path / "out"), "--workers", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LOADED=[]" in proc.stderr
    assert hashlib.sha256((tmp_path / "out.bin").read_bytes()).hexdigest() == _GOLDEN["uncased"][0]
    assert hashlib.sha256((tmp_path / "out.idx").read_bytes()).hexdigest() == _GOLDEN["uncased"][1]
