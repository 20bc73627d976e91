"""``bio-megatron bench data``: extraction and tokenization throughput on the bundled real sample.

Each configuration runs in a forked child so that its peak memory (``VmHWM``) is its own. The sample
is replicated ``--repeat`` times (PubMed files under new names, JSONL lines concatenated) to give the
timers something to measure; PubMed duplicates collapse to one document per PMID, as they should.

Baselines measured in the same run, on the same machine:
* extraction: ``ElementTree.parse`` of the whole file (no streaming) + a naive regex sentence split;
* tokenization: a per-sentence pure-Python WordPiece loop (BERT's original ``tokenization.py``
  algorithm), checked to produce the same ids as the Rust tokenizer before its speed is compared;
* whole process (``whole_process``): ``bio-megatron data tokenize`` as a fresh process, with its stage
  breakdown, against Megatron-LM's ``tools/preprocess_data.py`` when ``--megatron-lm`` names a checkout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import numpy as np

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
    parser.add_argument("--megatron-lm", default=None, metavar="PATH",
                        help="a Megatron-LM checkout: also time its tools/preprocess_data.py, whole process, on the "
                             "same JSONL and vocabulary, and print the ratio")
    parser.add_argument("--rounds", type=int, default=2, help="alternated whole-process runs per side (best kept)")
    parser.add_argument("--whole-process-only", action="store_true",
                        help="only the whole-process tokenize comparison (skip extraction and in-process stages)")


def run(args: argparse.Namespace) -> int:
    from bio_megatron.corpus.pmc import extract_pmc
    from bio_megatron.corpus.pubmed import extract_pubmed
    from bio_megatron.corpus.samples import sample_files
    from bio_megatron.corpus.tokenize import tokenize_corpus
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    vocab = args.vocab or str(Path(__file__).resolve().parents[1] / "resources" / "vocab" / "bert_base_uncased_vocab.txt")
    from bio_megatron.corpus.sentences import warm_up

    if args.whole_process_only:
        return _run_whole_process_only(args, vocab)

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
        results["tokenize_whole_process"] = whole_process(corpus, vocab, max(args.workers), d, args.megatron_lm,
                                                          args.rounds)
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
    return _report(results, args.output)


def _report(results: dict[str, Any], output: str | None) -> int:
    text = json.dumps(results, indent=2)
    sys.stdout.write(text + "\n")
    if output:
        Path(output).write_text(text + "\n")
    return 0


def _run_whole_process_only(args: argparse.Namespace, vocab: str) -> int:
    """The bundled sample extracted once, replicated ``repeat x tokenize_repeat`` times, then timed whole."""
    from bio_megatron.corpus.pmc import extract_pmc
    from bio_megatron.corpus.pubmed import extract_pubmed
    from bio_megatron.corpus.samples import sample_files

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        d = Path(tmp)
        extract_pubmed(sample_files()["pubmed"], d / "pm.jsonl")
        extract_pmc(sample_files()["pmc"], d / "pmc.jsonl")
        corpus = d / "corpus.jsonl"
        corpus.write_text(((d / "pm.jsonl").read_text() + (d / "pmc.jsonl").read_text())
                          * args.repeat * args.tokenize_repeat)
        results = {"vocab": vocab, "cpus": os.cpu_count(),
                   "tokenize_whole_process": whole_process(corpus, vocab, max(args.workers), d, args.megatron_lm,
                                                           args.rounds)}
    return _report(results, args.output)


# --- whole process: `data tokenize` vs Megatron-LM's tools/preprocess_data.py ---------------------
def _megatron_lm_tokenizer_dir(vocab: str, lowercase: bool, out: Path) -> Path:
    """The same vocabulary as a local Hugging Face tokenizer folder, which Megatron-LM's script loads
    offline (``--tokenizer-type HuggingFaceTokenizer``); its ``BertWordPiece*`` types fetch from the Hub."""
    from transformers import BertTokenizer

    BertTokenizer(vocab=vocab, do_lower_case=lowercase).save_pretrained(str(out))
    return out


def _timed_run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return wall, proc.stdout


def _same_ids(ours: Path, theirs: Path) -> bool:
    """Megatron-LM writes uint16 tokens for a small vocabulary, we write int32: compare ids and index."""
    from bio_megatron.corpus.indexed import read_index

    a_len, a_doc, a_dt = read_index(f"{ours}.idx")
    b_len, b_doc, b_dt = read_index(f"{theirs}.idx")
    a = np.fromfile(f"{ours}.bin", a_dt)
    b = np.fromfile(f"{theirs}.bin", b_dt)
    return (len(a) == len(b) and bool((a.astype(np.int64) == b.astype(np.int64)).all())
            and np.array_equal(a_len, b_len) and np.array_equal(a_doc, b_doc))


def whole_process(corpus: Path, vocab: str, workers: int, work: Path, megatron_lm: str | None = None,
                  rounds: int = 2, timeout: float = 3600) -> dict[str, Any]:
    """Wall clock of ``bio-megatron data tokenize`` as a fresh process (interpreter start and imports
    included) and, with ``megatron_lm``, of its ``tools/preprocess_data.py`` on the same JSONL (our
    ``sentences`` key, no sentence splitting on either side), alternated ``rounds`` times; best of each.
    ``data tokenize --encoder tokenizers`` (the Rust tokenizers alone, without flash-tokenizer in front) runs
    alternated with them, so the gain of ``corpus/fast_encode.py`` is measured under the same load."""
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ours_cmd = [sys.executable, "-m", "bio_megatron", "data", "tokenize", "--input", str(corpus), "--vocab", vocab,
                "--workers", str(workers), "--no-resume", "--output-prefix"]
    out: dict[str, Any] = {"workers": workers, "rounds": rounds, "input_bytes": corpus.stat().st_size,
                           "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    theirs_cmd: list[str] | None = None
    if megatron_lm:
        script = Path(megatron_lm) / "tools" / "preprocess_data.py"
        if not script.is_file():
            raise FileNotFoundError(f"{script}: not a Megatron-LM checkout (--megatron-lm)")
        tok_dir = _megatron_lm_tokenizer_dir(vocab, WordPieceTokenizer(vocab).lowercase, work / "hf_tokenizer")
        theirs_cmd = [sys.executable, str(script), "--input", str(corpus), "--json-keys", "sentences",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tok_dir),
                      "--tokenizer-hf-no-include-special-tokens", "--workers", str(workers), "--output-prefix"]
        theirs_env = {**env, "PYTHONPATH": os.pathsep.join([str(Path(megatron_lm).resolve()),
                                                            env.get("PYTHONPATH", "")])}
    ours_walls: list[float] = []
    theirs_walls: list[float] = []
    reference_walls: list[float] = []
    summary: dict[str, Any] = {}
    for r in range(rounds):  # alternate, so that load from other jobs hits both sides alike
        wall, stdout = _timed_run(ours_cmd + [str(work / "ours")], env, timeout)
        ours_walls.append(wall)
        summary = json.loads(stdout)
        reference_walls.append(_timed_run(ours_cmd + [str(work / "reference"), "--encoder", "tokenizers"], env,
                                          timeout)[0])
        if theirs_cmd is not None:
            theirs_walls.append(_timed_run(theirs_cmd + [str(work / "theirs")], theirs_env, timeout)[0])
    best = min(ours_walls)
    out["ours"] = {"wall_seconds": round(best, 3), "wall_seconds_all": [round(x, 3) for x in ours_walls],
                   "tokens": summary["tokens"], "tokens_per_s_whole_process": round(summary["tokens"] / best),
                   # the stages as `data tokenize` reports them; "startup" is everything before its timer
                   # started (interpreter, imports, argument parsing): wall minus its own "seconds"
                   "stages": {"startup": round(ours_walls[-1] - summary["seconds"], 3),
                              **summary["stage_seconds"], "in_process_seconds": summary["seconds"]},
                   "encoder": summary.get("encoder")}
    out["ours_tokenizers_encoder"] = {
        "wall_seconds": round(min(reference_walls), 3), "wall_seconds_all": [round(x, 3) for x in reference_walls],
        "same_bytes": all((work / f"ours{ext}").read_bytes() == (work / f"reference{ext}").read_bytes()
                          for ext in (".bin", ".idx"))}
    out["ratio_tokenizers_encoder_over_ours"] = round(min(reference_walls) / best, 2)
    if theirs_walls:
        out["megatron_lm"] = {"wall_seconds": round(min(theirs_walls), 3),
                              "wall_seconds_all": [round(x, 3) for x in theirs_walls],
                              "same_ids": _same_ids(work / "ours", work / "theirs_sentences_document")}
        out["ratio_megatron_lm_over_ours"] = round(min(theirs_walls) / best, 2)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return out
