"""``bio-megatron bench data``: extraction and tokenization throughput on the bundled real sample.

Each configuration runs in a forked child so that its peak memory (``VmHWM``) is its own. The sample
is replicated ``--repeat`` times (PubMed files under new names, JSONL lines concatenated) to give the
timers something to measure; PubMed duplicates collapse to one document per PMID, as they should.

Baselines measured in the same run, on the same machine:
* extraction: ``ElementTree.parse`` of the whole file (no streaming) + a naive regex sentence split;
* tokenization: a per-sentence pure-Python WordPiece loop (BERT's original ``tokenization.py``
  algorithm), checked to produce the same ids as the Rust tokenizer before its speed is compared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _child(fn: Callable[[], dict], q: Any) -> None:
    import resource

    out = fn()
    out["peak_rss_mb"] = round(_vm_hwm_mb(), 1)
    out["peak_worker_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    q.put(out)


def _isolated(fn: Callable[[], dict]) -> dict:
    """Run ``fn`` in a forked child; return its result with that child's peak memory."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, q))
    p.start()
    out = q.get()
    p.join()
    return out


# --- baselines --------------------------------------------------------------------------------------
class PythonWordPiece:
    """BERT's reference algorithm in plain Python: basic tokenization, then greedy longest-match."""

    def __init__(self, vocab_file: str, lowercase: bool):
        self.vocab = {t: i for i, t in enumerate(Path(vocab_file).read_text(encoding="utf-8").splitlines())}
        self.lowercase, self.unk = lowercase, self.vocab["[UNK]"]

    @staticmethod
    def _is_punct(ch: str) -> bool:
        cp = ord(ch)
        return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
                or unicodedata.category(ch).startswith("P"))

    def _words(self, text: str) -> list[str]:
        text = "".join(" " if unicodedata.category(c) in ("Zs", "Cc") or c in "\t\n\r" else c for c in text
                       if not (ord(c) in (0, 0xFFFD) or (unicodedata.category(c).startswith("C") and c not in "\t\n\r")))
        text = "".join(f" {c} " if 0x4E00 <= ord(c) <= 0x9FFF else c for c in text)
        if self.lowercase:
            text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        out: list[str] = []
        for tok in text.split():
            cur = ""
            for c in tok:
                if self._is_punct(c):
                    if cur:
                        out.append(cur)
                    out.append(c)
                    cur = ""
                else:
                    cur += c
            if cur:
                out.append(cur)
        return out

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in self._words(text):
            if len(word) > 100:
                ids.append(self.unk)
                continue
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    sub = word[start:end] if start == 0 else "##" + word[start:end]
                    if sub in self.vocab:
                        pieces.append(self.vocab[sub])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.unk]
                    break
                start = end
            ids.extend(pieces)
        return ids


def _extract_baseline(files: list[Path]) -> dict:
    from bio_megatron.corpus.sentences import naive_split
    from bio_megatron.corpus.xmlio import open_binary

    t0, docs = time.perf_counter(), 0
    for f in files:
        with open_binary(f) as fh:
            root = ET.parse(fh).getroot()  # the whole file in memory
        for art in root.iter("PubmedArticle"):
            text = " ".join("".join(t.itertext()) for t in art.iter("AbstractText"))
            if text.strip():
                naive_split(text)
                docs += 1
    el = time.perf_counter() - t0
    return {"records_per_s": round(docs / el, 1), "seconds": round(el, 3)}


# --- the benchmark ----------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=20, help="copies of the bundled sample to process")
    parser.add_argument("--vocab", default=None, help="vocab.txt (default: bundled BERT uncased)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to compare")
    parser.add_argument("--baseline-sentences", type=int, default=3000, help="sentences for the Python loop")
    parser.add_argument("--tokenize-repeat", type=int, default=5, help="further copies for tokenization")
    parser.add_argument("--shard-lines", type=int, default=500, help="documents per tokenization shard")
    parser.add_argument("--output", default=None, help="also write the results JSON here")


def run(args: argparse.Namespace) -> int:
    from bio_megatron.corpus.pmc import extract_pmc
    from bio_megatron.corpus.pubmed import extract_pubmed
    from bio_megatron.corpus.samples import sample_files
    from bio_megatron.corpus.tokenize import tokenize_corpus
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    vocab = args.vocab or str(Path(__file__).resolve().parents[1] / "resources" / "vocab" / "bert_base_uncased_vocab.txt")
    import megatron.core.datasets.indexed_dataset  # noqa: F401  # import costs paid once, before forking
    from bio_megatron.corpus.sentences import warm_up

    warm_up()

    sample = sample_files()
    results: dict[str, Any] = {"repeat": args.repeat, "cpus": os.cpu_count(), "vocab": vocab}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        d = Path(tmp)
        files = []
        for r in range(args.repeat):
            for f in sample["pubmed"]:
                files.append(d / f"r{r:03d}-{f.name}")
                shutil.copy(f, files[-1])
        pmc_files = [f for _ in range(max(1, args.repeat // 4)) for f in sample["pmc"]]
        results["extract_baseline_etree_naive"] = _isolated(lambda: _extract_baseline(files))
        for w in args.workers:
            res = _isolated(lambda: extract_pubmed(files, d / f"pm{w}.jsonl", workers=w))
            results[f"extract_pubmed_w{w}"] = {"records_per_s": round(res["records"] / res["seconds"], 1),
                                               "seconds": res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
                                               "peak_worker_rss_mb": res["peak_worker_rss_mb"]}
            res = _isolated(lambda: extract_pmc(pmc_files, d / f"pmc{w}.jsonl", workers=w))
            results[f"extract_pmc_w{w}"] = {"docs_per_s": res["docs_per_s"], "seconds": res["seconds"]}
        one = (d / "pm1.jsonl").read_text() + (d / "pmc1.jsonl").read_text()
        corpus = d / "corpus.jsonl"
        corpus.write_text(one * args.repeat * args.tokenize_repeat)  # identical work per copy

        from bio_megatron.corpus.sentences import compare_with_naive
        from bio_megatron.corpus.xmlio import iter_elements, text_of

        passages = [text_of(t) for f in sample["pubmed"] for a in iter_elements(f, {"PubmedArticle"})
                    for t in a.iter("AbstractText")]
        results["sentence_splitting_punkt_vs_naive_regex"] = compare_with_naive([p for p in passages if p])
        sents = [s for line in one.splitlines() for s in json.loads(line)["sentences"]][: args.baseline_sentences]
        tok = WordPieceTokenizer(vocab)
        py = PythonWordPiece(vocab, tok.lowercase)
        t0 = time.perf_counter()
        py_ids = [py.tokenize(s) for s in sents]
        el = time.perf_counter() - t0
        agree = sum(a == b for a, b in zip(py_ids, tok.tokenize_batch(sents))) / max(len(sents), 1)
        results["tokenize_baseline_python_loop"] = {
            "tokens_per_s": round(sum(map(len, py_ids)) / el), "sentences": len(sents),
            "agreement_with_rust": round(agree, 4)}
        for w in args.workers:
            res = _isolated(lambda: tokenize_corpus(corpus, vocab, d / f"tok{w}", workers=w, resume=False,
                                                          shard_lines=args.shard_lines))
            results[f"tokenize_w{w}"] = {k: res[k] for k in ("documents", "sentences", "tokens", "tokens_per_s",
                                                            "docs_per_s", "tokenize_seconds", "seconds",
                                                            "peak_rss_mb", "peak_worker_rss_mb")}
            results[f"tokenize_w{w}"]["tokens_per_s_per_worker"] = round(res["tokens_per_s"] / w)
        same = all((d / f"tok{args.workers[0]}{e}").read_bytes() == (d / f"tok{w}{e}").read_bytes()
                   for w in args.workers for e in (".bin", ".idx"))
        results["outputs_identical_across_workers"] = same
    base_tok = results["tokenize_baseline_python_loop"]["tokens_per_s"]
    base_ext = results["extract_baseline_etree_naive"]["records_per_s"]
    w0 = args.workers[0]
    results["ratios"] = {
        **{f"tokenize_w{w}_vs_python_loop": round(results[f"tokenize_w{w}"]["tokens_per_s"] / base_tok, 2)
           for w in args.workers},
        **{f"extract_pubmed_w{w}_vs_etree_naive": round(results[f"extract_pubmed_w{w}"]["records_per_s"] / base_ext, 2)
           for w in args.workers},
        **{f"tokenize_w{w}_vs_w{w0}": round(results[f"tokenize_w{w}"]["tokens_per_s"]
                                           / results[f"tokenize_w{w0}"]["tokens_per_s"], 2) for w in args.workers[1:]},
    }
    text = json.dumps(results, indent=2)
    sys.stdout.write(text + "\n")
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0
