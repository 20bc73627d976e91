"""One shard of ``data tokenize``: the worker side (``corpus/tokenize.py`` runs the shards).

A worker holds its tokenizer, encoder and JSON keys in module globals, set once by :func:`init_worker` (a
pool's initializer) or :func:`in_this_process` (``workers=1``), so :func:`tokenize_shard`'s arguments stay
(index, lines, prefix): the only thing sent to a pool process per shard is its lines.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bio_megatron.corpus import shards
from bio_megatron.corpus.fast_encode import fast_encoder
from bio_megatron.corpus.indexed import index_bytes
from bio_megatron.corpus.schema import ReadStats, parse_record, parse_text_record
from bio_megatron.corpus.sentences import split_sentences
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

_TOKENIZER: WordPieceTokenizer | None = None
# What encodes a shard's sentences: the tokenizer, or flash-tokenizer in front of it (``corpus/fast_encode.py``).
_ENCODER = None
# Megatron-LM mode: the JSON keys whose text makes a document (None: our ``sentences`` schema).
_JSON_KEYS: tuple[str, ...] | None = None


def init_worker(vocab: str, lowercase: bool | None, json_keys: tuple[str, ...] | None = None,
                 encoder: str = "auto") -> None:
    """A pool process's initializer: its own tokenizer, loaded from the vocabulary's path."""
    global _TOKENIZER, _JSON_KEYS, _ENCODER
    _JSON_KEYS = json_keys
    # One process = one core: stop the Rust tokenizer from also spawning its own thread pool.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _TOKENIZER = load_tokenizer(vocab, lowercase=lowercase)
    _TOKENIZER.warn_unknown_rate = None  # the run stops on its own --max-unk-rate instead (per shard: no spam)
    _ENCODER = fast_encoder(_TOKENIZER, encoder)


def iter_shards(paths: list[Path], shard_lines: int) -> Iterator[list[tuple[str, int, bytes]]]:
    """Consecutive groups of ``shard_lines`` non-blank input lines, each tagged with file and line."""
    shard: list[tuple[str, int, bytes]] = []
    for path in paths:
        check_input_file(path)
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if raw.strip():
                    shard.append((str(path), lineno, raw))
                    if len(shard) == shard_lines:
                        yield shard
                        shard = []
    if shard:
        yield shard


def tokenize_shard(index: int, lines: list[tuple[str, int, bytes]], shard_prefix: str) -> dict[str, Any]:
    """Worker: decode, validate and tokenize one shard, write it as a small indexed dataset, return counts."""
    assert _TOKENIZER is not None and _ENCODER is not None
    t0 = time.perf_counter()
    stats = ReadStats()
    sents: list[str] = []
    doc_sizes: list[int] = []  # sentences per usable record
    for path, lineno, raw in lines:
        if _JSON_KEYS is None:
            obj, why = parse_record(raw)
            doc = obj["sentences"] if why is None else []
        else:
            # Several keys (title, text): one document, their sentences in the order the keys were given.
            texts, why = parse_text_record(raw, _JSON_KEYS)
            doc = [x for t in (texts or []) for x in split_sentences(t)]
        if why is not None:
            stats.skip(f"{path}:{lineno}", why)
            continue
        n = len(sents)
        sents.extend(s for s in doc if s.strip())
        doc_sizes.append(len(sents) - n)
    t1 = time.perf_counter()
    ids = _ENCODER.tokenize_batch(sents) if sents else []
    t2 = time.perf_counter()
    # Whole-shard numpy instead of per-document lists: the tokens are all ids back to back (an empty
    # sentence has none); only the index needs the document structure.
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    tokens = np.fromiter(chain.from_iterable(ids), np.int32, int(lengths.sum()))
    keep = lengths > 0  # whitespace-only sentence -> no item
    doc_of = np.repeat(np.arange(len(doc_sizes)), doc_sizes)
    kept = np.bincount(doc_of[keep], minlength=len(doc_sizes))
    kept = kept[kept > 0]  # megatron's samplers assume every document has at least one sentence
    doc_index = np.concatenate([[0], np.cumsum(kept)])
    tmp = f".tmp-{os.getpid()}"  # unique per writer, so two writers can never share a half-written file
    with open(shard_prefix + ".bin" + tmp, "wb") as fh:
        fh.write(tokens.tobytes())
    with open(shard_prefix + ".idx" + tmp, "wb") as fh:
        fh.write(index_bytes(lengths[keep], doc_index))
    for ext in (".bin", ".idx"):
        os.replace(shard_prefix + ext + tmp, shard_prefix + ext)
    t3 = time.perf_counter()
    unk_at = np.flatnonzero(tokens == _TOKENIZER.unk)
    # A few sentences holding [UNK], for the message when the rate is too high.
    unk_sents = np.unique(np.searchsorted(np.cumsum(lengths), unk_at[:200], side="right"))[:3]
    result = {"shard": index, "lines": len(lines), "documents": len(kept), "sentences": int(keep.sum()),
              "tokens": len(tokens), "unknown_tokens": len(unk_at),
              "unknown_samples": [sents[int(i)][:120] for i in unk_sents],
              **shards.checksum(shard_prefix),
              "skipped_records": stats.skipped, "empty_documents": len(doc_sizes) - len(kept),
              "problems": stats.problems,
              "stage_seconds": {"parse": t1 - t0, "encode": t2 - t1, "write": t3 - t2}}
    with open(shard_prefix + ".json" + tmp, "w") as fh:
        json.dump(result, fh)
    os.replace(shard_prefix + ".json" + tmp, shard_prefix + ".json")  # the shard's commit point
    return result


@contextmanager
def in_this_process(tokenizer: WordPieceTokenizer, json_keys: tuple[str, ...] | None = None,
                    encoder: str = "auto") -> Iterator[None]:
    """workers=1: tokenize in this process, single-threaded, so 1 vs N workers is a fair comparison; the
    caller's ``TOKENIZERS_PARALLELISM`` is back as it was afterwards."""
    global _TOKENIZER, _JSON_KEYS, _ENCODER
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _JSON_KEYS = json_keys
    _TOKENIZER = tokenizer
    tokenizer.warn_unknown_rate = None  # the run stops on its own --max-unk-rate instead (per shard: no spam)
    _ENCODER = fast_encoder(tokenizer, encoder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
