"""`vocab train --type bpe` (RoBERTa byte-level BPE) and `data tokenize` with it, on the bundled corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


from bio_megatron.cli import main
from bio_megatron.utils.errors import DataError


@pytest.fixture(scope="module")
def jsonl(pubmed_prefix) -> list[Path]:
    data = Path(pubmed_prefix).parent
    return [data / "pubmed.jsonl", data / "pmc.jsonl"]


@pytest.fixture(scope="module")
def bpe_dir(jsonl, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bpe") / "bpe_vocab"
    assert main(["vocab", "train", "--type", "bpe", "--size", "2000", "--input", *map(str, jsonl),
                 "--output", str(out)]) == 0
    return out


def test_bpe_specials_as_roberta(bpe_dir):
    vocab = json.loads((bpe_dir / "vocab.json").read_text())
    assert len(vocab) == 2000
    assert [vocab[t] for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert vocab["<mask>"] == len(vocab) - 1  # as roberta-base: the last id
    assert (bpe_dir / "merges.txt").is_file() and (bpe_dir / "tokenizer.json").is_file()


def test_tokenize_ids_equal_tokenizers(bpe_dir, jsonl, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer

    prefix = tmp_path / "bpe_corpus"
    assert main(["data", "tokenize", "--input", *map(str, jsonl), "--vocab", str(bpe_dir),
                 "--output-prefix", str(prefix), "--workers", "1"]) == 0
    reference = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))  # the trainer's own serialisation
    sentences = [s for f in jsonl for line in f.read_text().splitlines() if line.strip()
                 for s in json.loads(line)["sentences"] if s.strip()]
    expected = [reference.encode(s, add_special_tokens=False).ids for s in sentences]
    ds = IndexedDataset(str(prefix))
    got = [ds[i].tolist() for i in range(len(ds))]
    flat_expected = [i for ids in expected for i in ids]
    flat_got = [i for ids in got for i in ids]
    assert len(flat_got) > 10_000 and flat_got == flat_expected
    assert int(np.max(flat_got)) < 1999  # never <mask>: text cannot produce it


def test_vocab_json_path_and_errors(bpe_dir, tmp_path):
    from bio_megatron.vocab.bpe import BPETokenizer, load_tokenizer

    tok = load_tokenizer(bpe_dir / "vocab.json")
    assert isinstance(tok, BPETokenizer) and (tok.cls, tok.pad, tok.sep, tok.unk, tok.mask) == (0, 1, 2, 3, 1999)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    with pytest.raises(DataError, match="merges.txt"):
        load_tokenizer(tmp_path / "vocab.json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(DataError, match="special token"):
        load_tokenizer(tmp_path)

