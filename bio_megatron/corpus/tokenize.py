"""JSON-lines documents -> megatron-core indexed data (``<prefix>.bin`` / ``<prefix>.idx``).

One item per sentence (int32 WordPiece ids, no special tokens) and a document boundary per input
document, the layout megatron-core's ``BERTMaskedWordPieceDataset`` samples sentence pairs from.

How the properties the pipeline promises are obtained:

* **Deterministic whatever the worker count**: the input is cut into shards of a fixed number of
  lines (``shard_lines``), independent of ``workers``; each shard becomes its own small indexed
  dataset, and the shards are concatenated in order (``corpus.indexed.IndexedWriter.add_index``).
* **Streaming**: the reader keeps at most ``2 * workers`` shards in flight, so memory does not grow
  with the corpus (only the in-memory index of sentence lengths does, ~4 bytes a sentence).
* **No torch**: the ``.bin/.idx`` are written with numpy in megatron-core's format (``corpus.indexed``,
  proven byte-identical to its ``IndexedDatasetBuilder``), so the run never imports torch or megatron.
* **Resumable**: finished shards live in ``<prefix>.shards/`` with a ``.json`` written last; a rerun
  with the same inputs, vocabulary and settings reuses them once each matches its recorded sizes, counts
  and sha256 (a damaged one is redone). A manifest guards against mixing runs (``corpus/shards.py``).
* **Never touches what it did not write**: a ``.shards/`` folder without our manifest, or ``.bin/.idx``
  without our record ``<prefix>.bio_megatron.json``, is refused unless ``--overwrite``; only files with our
  shard names are ever removed. The record also holds the vocabulary's hash and casing, which pretraining
  checks (``corpus/record.py``).
* **Stops on a vocabulary that does not fit**: more than ``max_unk_rate`` of the tokens ``[UNK]`` (checked
  from the first 10,000 tokens on, and at the end) is an error with the rate and sample sentences.
* **Atomic**: shards and the final pair are written to temporary names (with the writer's PID) and
  renamed when complete; ``<prefix>.lock`` keeps a second run off the same prefix while one is running.
* **Never an empty success**: when no input record is usable (wrong schema, e.g. Megatron-LM
  ``{"text": ...}`` lines without ``json_keys``), it fails naming the first bad ``file:line``s and
  leaves no ``.bin/.idx``.
* **Fast**: sentences are batch-encoded by the Rust ``tokenizers`` WordPiece, one batch per shard
  (``corpus/shard_worker.py``, in a pool of ``workers`` processes or in this one).
"""

from __future__ import annotations

import errno
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from bio_megatron.corpus import record, shard_worker, shards
from bio_megatron.corpus.fast_encode import encoder_name
from bio_megatron.corpus.indexed import IndexedWriter
from bio_megatron.corpus.sentences import warm_up
from bio_megatron.corpus.xmlio import Progress
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file, os_error
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.bpe import bpe_files, is_bpe, load_tokenizer
from bio_megatron.vocab.sentencepiece import spiece_file
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

log = get_logger(__name__)
# 3: shard records carry sizes and a sha256 (2: without; 1: np.savez indices), so older shards are not reused.
_MANIFEST_VERSION = 3
# Default for --max-unk-rate. A WordPiece vocabulary falls back to sub-words and single characters, so [UNK]
# comes only from characters it lacks: bert-base-cased on the bundled PubMed/PMC sample gives well under 0.1 %.
# 5 % is 50x that, and far below what a wrong vocabulary gives (an uncased-only or another script's: 20-100 %).
MAX_UNK_RATE = 0.05
_UNK_CHECK_FROM = 10_000  # tokens seen before the rate is trusted mid-run (the final check always runs)


def _manifest(paths: list[Path], vocab: Path, lowercase: bool | None, shard_lines: int,
              json_keys: tuple[str, ...] | None) -> dict[str, Any]:
    m = {"version": _MANIFEST_VERSION, "shard_lines": shard_lines, "lowercase": lowercase,
         "vocab_sha256": record.vocab_fingerprint(vocab)["sha256"],
         "inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                    for p in paths if p.is_file()]}
    if json_keys:  # only when set, so shards of runs made before the option existed stay reusable
        m["json_keys"] = list(json_keys)
    return m


def _no_usable_records(paths: list[Path], results: dict[int, dict[str, Any]],
                       json_keys: tuple[str, ...] | None) -> DataError:
    """The error for inputs without a single usable document: what was expected, and the first problems."""
    lines = sum(r["lines"] for r in results.values())
    problems = [p for k in sorted(results) for p in results[k]["problems"]]
    expected = (f"JSON objects with string field(s) {', '.join(map(repr, json_keys))}" if json_keys else
                "JSON objects with 'id', 'source' (pubmed|pmc) and a 'sentences' list of strings "
                "(or Megatron-LM {\"text\": ...} lines with --json-keys text)")
    if problems:
        found = "; first problems: " + " | ".join(problems[:3])
    else:
        found = f"; all {lines} records had no text"
    return DataError(f"no usable document in {lines} non-blank line(s); expected {expected}{found}",
                     ", ".join(map(str, paths)))


def tokenize_corpus(inputs: list[str | Path] | str | Path, vocab: str | Path, output_prefix: str | Path,
                    workers: int = 1, lowercase: bool | None = None, shard_lines: int = 2000,
                    resume: bool = True, keep_shards: bool = False,
                    json_keys: list[str] | tuple[str, ...] | None = None, encoder: str = "auto",
                    overwrite: bool = False, max_unk_rate: float = MAX_UNK_RATE, **opts: Any) -> dict[str, Any]:
    """Tokenize JSONL documents into ``<output_prefix>.bin/.idx``; return a summary.

    ``lowercase=None`` follows the vocabulary (an uncased vocab lower-cases). ``json_keys`` reads
    Megatron-LM style ``{"text": ...}`` lines instead of our ``sentences`` schema: the keys' texts,
    in order, make one document, split into sentences by ``corpus.sentences``. ``encoder``: ``auto``
    puts flash-tokenizer in front of a WordPiece vocabulary where its ids are exact (``corpus/fast_encode.py``),
    ``tokenizers`` uses the Rust ``tokenizers`` alone; the ids are the same. A few bad JSONL lines
    are skipped, counted and listed in the summary; no usable line at all, a missing/empty input, a
    bad vocabulary or a prefix held by another run is fatal. ``overwrite`` lets it replace a ``.bin/.idx``
    it did not write and write beside a foreign ``.shards/`` folder's files; ``max_unk_rate`` (0..1) is the
    highest share of ``[UNK]`` tokens accepted.
    """
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if not paths:
        raise DataError("no input JSONL files given")
    for path in paths:  # before anything is created or locked: a typo must not leave a shard folder behind
        check_input_file(path)
    if not 0.0 <= max_unk_rate <= 1.0:
        raise DataError(f"--max-unk-rate must be between 0 and 1 (got {max_unk_rate})")
    keys = tuple(json_keys) if json_keys else None
    vocab = Path(vocab)
    if is_bpe(vocab):  # a byte-level BPE folder: its vocab.json names (and fingerprints) the vocabulary
        vocab = bpe_files(vocab)[0]
    elif vocab.is_dir() and spiece_file(vocab) is not None:  # an ALBERT folder: its spiece.model
        vocab = spiece_file(vocab)
    tokenizer = load_tokenizer(vocab, lowercase=lowercase)  # validates the vocab before any work
    prefix = Path(output_prefix)
    record.check_output_owned(prefix, overwrite)  # before any work: a refusal costs nothing
    with exclusive_lock(f"{prefix}.lock", f"output prefix {prefix}"):
        try:
            return _tokenize_locked(paths, vocab, tokenizer, prefix, workers, shard_lines, resume,
                                    keep_shards, keys, encoder, overwrite, max_unk_rate)
        except OSError as e:
            # Only our own outputs (all named <prefix>...), or any full disk / quota: e.g. the disk filled or
            # the folder became read-only. Finished shards stay (a rerun resumes); temporaries go.
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            if not full and (e.filename is None or not str(e.filename).startswith(str(prefix))):
                raise
            shards.remove_ours(Path(f"{prefix}.shards"), temporaries_only=True)
            raise os_error(e, e.filename if e.filename is not None else f"{prefix}.shards") from None


def _tokenize_locked(paths: list[Path], vocab: Path, tokenizer: WordPieceTokenizer, prefix: Path, workers: int,
                     shard_lines: int, resume: bool, keep_shards: bool,
                     keys: tuple[str, ...] | None, encoder: str = "auto", overwrite: bool = False,
                     max_unk_rate: float = MAX_UNK_RATE) -> dict[str, Any]:
    work = Path(f"{prefix}.shards")
    shards.prepare(work, _manifest(paths, vocab, tokenizer.lowercase, shard_lines, keys), resume, overwrite)
    check_unk = _unk_checker(tokenizer, vocab, max_unk_rate)
    done = _Finished(check_unk, Progress("tokenize shards",
                                         total_bytes=sum(p.stat().st_size for p in paths if p.is_file())))
    stages = {"read": 0.0, "parse": 0.0, "encode": 0.0, "write": 0.0}
    if keys is not None:
        warm_up()  # load NLTK once; forked workers inherit it
    if workers > 1:
        pool = ProcessPoolExecutor(max_workers=workers, initializer=shard_worker.init_worker,
                                   initargs=(str(vocab), tokenizer.lowercase, keys, encoder))
    else:
        pool = None
    try:
        with nullcontext() if pool else shard_worker.in_this_process(tokenizer, keys, encoder):
            for k, lines in enumerate(_timed(shard_worker.iter_shards(paths, shard_lines), stages)):
                nbytes = sum(len(raw) for _, _, raw in lines)
                shard_prefix = str(work / f"shard-{k:06d}")
                if resume and done.reused(k, shard_prefix, nbytes):
                    continue
                if pool is None:
                    done.add(k, shard_worker.tokenize_shard(k, lines, shard_prefix), nbytes)
                    continue
                done.pending[k] = (pool.submit(shard_worker.tokenize_shard, k, lines, shard_prefix), nbytes)
                while len(done.pending) >= 2 * workers:  # bounded in-flight work keeps memory flat
                    done.collect(oldest=True)
            done.collect(every=True)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    results, tokenize_s = done.results, done.progress.elapsed

    if not any(r["documents"] for r in results.values()):
        # Shards of nothing are no progress worth resuming; an empty .bin must never look like a dataset.
        shards.remove_ours(work)
        if not results:
            raise DataError("no documents found in the inputs (only blank lines)", ", ".join(map(str, paths)))
        raise _no_usable_records(paths, results, keys)
    check_unk(results, final=True)
    t0 = time.perf_counter()
    record.check_output_owned(prefix, overwrite)  # again: the files may have appeared while we worked
    _write_output(prefix, work, len(results))
    stages["write"] += time.perf_counter() - t0
    for k in sorted(results):  # reused shards keep the timings of the run that made them: leave them out
        if "stage_seconds" in results[k] and k not in done.reused_ids:
            for name, sec in results[k]["stage_seconds"].items():
                stages[name] += sec
    tot = {key: sum(r[key] for r in results.values()) for key in
           ("documents", "sentences", "tokens", "unknown_tokens", "skipped_records", "empty_documents")}
    summary = {**tot, "shards": len(results), "shards_reused": len(done.reused_ids), "workers": workers,
               "lowercase": tokenizer.lowercase, "vocab": str(vocab), "vocab_size": tokenizer.vocab_size,
               "json_keys": list(keys) if keys else None,
               "encoder": encoder_name(tokenizer, encoder),
               "unknown_rate": round(tot["unknown_tokens"] / max(tot["tokens"], 1), 6),
               "problems": [p for k in sorted(results) for p in results[k]["problems"]][:20],
               "seconds": round(done.progress.elapsed, 3), "tokenize_seconds": round(tokenize_s, 3),
               "tokens_per_s": round(tot["tokens"] / max(tokenize_s, 1e-9)),
               "docs_per_s": round(tot["documents"] / max(tokenize_s, 1e-9), 1),
               "output_prefix": str(prefix),
               # read and the final write run in this process; parse, encode and shard writes are
               # summed over the workers (worker-seconds, > wall time when workers overlap).
               "stage_seconds": {name: round(sec, 3) for name, sec in stages.items()}}
    log.info("tokenized %d documents, %d sentences, %d tokens (unk %.4f%%, %d bad records skipped) "
             "in %.1fs: %s tokens/s", summary["documents"], summary["sentences"], summary["tokens"],
             100 * summary["unknown_rate"], summary["skipped_records"], summary["seconds"],
             f"{summary['tokens_per_s']:,}")
    record.write_record(prefix, record.vocab_fingerprint(vocab), tokenizer.lowercase, summary)
    if not keep_shards:  # only now: until the record is written, a rerun must still find the shards
        shards.remove_ours(work)
    return summary


class _Finished:
    """The shards finished so far, in this run or reused from an earlier one, with the progress line and the
    ``[UNK]`` check updated as each one lands; ``pending`` holds the pool's (future, input bytes) by shard."""

    def __init__(self, check_unk: Callable[[dict[int, dict[str, Any]], bool], None], progress: Progress):
        self.check_unk, self.progress = check_unk, progress
        self.results: dict[int, dict[str, Any]] = {}
        self.reused_ids: set[int] = set()
        self.pending: dict[int, tuple[Future, int]] = {}

    def reused(self, k: int, shard_prefix: str, nbytes: int) -> bool:
        """Take shard ``k`` from disk when an earlier run finished it and it verifies."""
        rec, why = shards.load_verified(shard_prefix)
        if rec is None:
            if why is not None:
                log.warning("redoing shard %d of %s: %s", k, Path(shard_prefix).parent, why)
            return False
        self.results[k] = rec
        self.reused_ids.add(k)
        self.progress.update(1, nbytes=nbytes)
        return True

    def add(self, k: int, result: dict[str, Any], nbytes: int) -> None:
        self.results[k] = result
        self.check_unk(self.results, False)
        self.progress.update(1, tokens=result["tokens"], nbytes=nbytes, docs=result["documents"])

    def collect(self, oldest: bool = False, every: bool = False) -> None:
        """Take the pool's finished shards in order: after waiting for the oldest, or for all with ``every``."""
        if oldest:
            next(iter(self.pending.values()))[0].result()
        for k in sorted(self.pending):
            if every or self.pending[k][0].done():
                future, nbytes = self.pending.pop(k)
                self.add(k, future.result(), nbytes)


def _unk_checker(tokenizer: Any, vocab: Path, max_rate: float):
    """``check(results, final)``: raise when the share of ``[UNK]`` tokens so far exceeds ``max_rate``
    (mid-run only once enough tokens were seen for the rate to mean something)."""
    unk_name = tokenizer.inv_vocab[tokenizer.unk]

    def check(results: dict[int, dict[str, Any]], final: bool) -> None:
        tokens = sum(r["tokens"] for r in results.values())
        unknown = sum(r["unknown_tokens"] for r in results.values())
        if not tokens or (not final and tokens < _UNK_CHECK_FROM) or unknown <= max_rate * tokens:
            return
        sample = next((s for k in sorted(results) for s in results[k].get("unknown_samples", [])), "")
        raise DataError(f"{unknown / tokens:.1%} of the tokens are {unk_name} ({unknown} of {tokens} in "
                        f"{len(results)} shard(s)), above --max-unk-rate {max_rate:g}: this vocabulary does not "
                        f"fit the text (another vocabulary, or the casing: --lowercase / --cased?); e.g. "
                        f"{sample!r}", str(vocab))

    return check


def _write_output(prefix: Path, work: Path, n_shards: int) -> None:
    """Concatenate the shards in order into ``<prefix>.bin/.idx``, under PID-suffixed temporary names
    first, removed again on any failure so that nothing half-written is left beside the outputs.

    Written by ``corpus.indexed`` (numpy), byte-identical to megatron-core's ``IndexedDatasetBuilder``:
    importing torch and megatron-core only for this cost more than the whole tokenization of a small corpus.
    """
    tmp = Path(f"{prefix}.tmp-{os.getpid()}")
    try:
        writer = IndexedWriter(f"{tmp}.bin", dtype=np.int32)
        try:
            for k in range(n_shards):
                writer.add_index(work / f"shard-{k:06d}")
            writer.finalize(f"{tmp}.idx")
        except BaseException:
            writer.close()
            raise
        os.replace(f"{tmp}.bin", f"{prefix}.bin")
        os.replace(f"{tmp}.idx", f"{prefix}.idx")
    finally:
        for ext in (".bin", ".idx"):
            Path(f"{tmp}{ext}").unlink(missing_ok=True)


def _timed(it: Iterator[Any], stages: dict[str, float]) -> Iterator[Any]:
    """``it``, adding the time spent producing each item to ``stages["read"]``."""
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            stages["read"] += time.perf_counter() - t0
        yield item
