"""``bio-megatron bench predict``: ``predict ner`` against transformers' ``pipeline("token-classification")``.

Both sides run as the user runs them, each a fresh process on the same sentences and the same weights (one HF
folder, :mod:`bio_megatron.bench.hf_models`): ours is ``bio-megatron predict ner --checkpoint FOLDER``, theirs a
script of transformers alone (:mod:`bio_megatron.bench.hf_baseline`) with ``aggregation_strategy="first"`` (the
grouping ``predict ner`` equals) and batches of 32, as ours. Measured: whole-process sentences/s (start-up, model
load and writing included: users wait for all of it), each side's start-up alone (the same command on one sentence)
and the rate after it, peak RSS (``wait4``'s ``ru_maxrss`` of that process), and the fraction of sentences on
which both found the same entities (a check that both ran the same model). Rounds alternate the order (ours first,
then theirs first), and the best round of each side is kept: on a shared CPU other jobs only ever slow a run down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bio_megatron.utils.errors import ConfigError, DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

BATCH = 32  # predict ner's batch (predict_documents' default); the pipeline gets the same
BASELINE = Path(__file__).with_name("hf_baseline.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="sentences, one per line (each line is one predict ner document)")
    src.add_argument("--iob", help="an IOB/CoNLL file (word<TAB>tag lines, blank line between sentences): its "
                     "sentences, words joined by spaces, e.g. BC5CDR's train.tsv")
    parser.add_argument("--limit", type=int, default=2000, help="at most this many sentences (default 2000)")
    parser.add_argument("--model", default=None,
                        help="Hugging Face folder (an encoder gets a seeded 3-label head; a token-classification "
                             "folder is used as it is); default: a seeded tiny BERT")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per side, alternating; the best is kept")
    parser.add_argument("--no-startup", action="store_true", help="skip the one-sentence start-up runs")
    parser.add_argument("--json", default=None, help="write the results here (atomically)")


def check_common(args: argparse.Namespace) -> None:
    """Option values, all problems at once (exit 2 before anything runs)."""
    bad = [f"{flag} must be >= 1, got {v}" for flag, v in
           (("--limit", args.limit), ("--threads", args.threads), ("--rounds", args.rounds)) if v < 1]
    if bad:
        raise ConfigError(bad)


def read_sentences(args: argparse.Namespace) -> list[str]:
    """The benchmark's sentences (at most ``--limit``), each on one line, none blank."""
    from bio_megatron.utils.input_files import check_input_file

    if args.text:
        from bio_megatron.predict.inputs import text_lines

        path = check_input_file(args.text, "--text")
        out = [line.strip() for _, line in text_lines(path, "one sentence per line") if line.strip()]
    else:
        from bio_megatron.corpus.iob import read_iob

        path = check_input_file(args.iob, "--iob")
        out = [" ".join(s.words) for s in read_iob(path) if s.words]
    if not out:
        raise DataError("no sentences (expected " + ("one sentence per line)" if args.text else
                                                     "word<TAB>tag lines)"), str(path))
    return out[:args.limit]


def child_env(threads: int) -> dict[str, str]:
    """The environment of both sides' processes: the same threads, offline, the same warnings."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_process(argv: list[str], env: dict[str, str], log_path: Path) -> dict:
    """Run ``argv`` to its end: wall seconds, peak RSS (MiB, of that process alone: ``wait4``) and its stdout.
    A failure raises with the tail of its stderr."""
    with open(log_path, "w") as err, tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read()
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(map(str, argv[:6]))} ... exited {proc.returncode}:\n{tail}")
    return {"wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024, "stdout": stdout}


def _ours(folder: Path, text: Path, out: Path, env: dict, tmp: Path) -> dict:
    return run_process([sys.executable, "-m", "bio_megatron", "predict", "ner", "--checkpoint", str(folder),
                        "--input", str(text), "--out", str(out)], env, tmp / "ours.log")


def _theirs(folder: Path, text: Path, out: Path, env: dict, tmp: Path, threads: int) -> dict:
    spec = tmp / f"hf_args_{out.stem}.json"
    spec.write_text(json.dumps({"model": str(folder), "input": str(text), "out": str(out), "batch": BATCH,
                                "threads": threads}))
    res = run_process([sys.executable, str(BASELINE), "predict", str(spec)], env, tmp / "hf.log")
    res["phases_s"] = json.loads(res.pop("stdout").strip().splitlines()[-1])["seconds"]
    return res


def same_entities(ours: Path, theirs: Path) -> float:
    """Fraction of lines whose entities (type, start, end) are the same on both sides."""
    a = [json.loads(x)["entities"] for x in ours.read_text().splitlines()]
    b = [json.loads(x)["entities"] for x in theirs.read_text().splitlines()]
    key = lambda ents: [(e["type"], e["start"], e["end"]) for e in ents]  # noqa: E731
    return sum(key(x) == key(y) for x, y in zip(a, b)) / max(1, len(a)) if len(a) == len(b) else 0.0


def multi_sentence_lines(sentences: list[str]) -> int:
    """Lines ``predict ner`` cuts into several sentences (the pipeline reads each line whole): where the two may
    differ by design, e.g. BC5CDR's "0 . 03" ends a sentence for our splitter."""
    from bio_megatron.tasks.re_data import split_sentences

    return sum(len(split_sentences(s)) > 1 for s in sentences)


def measure(args: argparse.Namespace, tmp: Path) -> dict:
    from bio_megatron.bench.hf_models import task_folder

    sentences = read_sentences(args)
    folder, what = task_folder(args.model, "token", ["O", "B-Entity", "I-Entity"], tmp)
    text = tmp / "sentences.txt"
    text.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    one = tmp / "one.txt"
    one.write_text(sentences[0] + "\n", encoding="utf-8")
    env = child_env(args.threads)
    runs: dict[str, list[dict]] = {"ours": [], "transformers": []}
    start: dict[str, dict] = {}
    for r in range(args.rounds):
        for side in (("ours", "transformers") if r % 2 == 0 else ("transformers", "ours")):
            out = tmp / f"{side}.jsonl"
            res = (_ours(folder, text, out, env, tmp) if side == "ours" else
                   _theirs(folder, text, out, env, tmp, args.threads))
            res.pop("stdout", None)
            log.info("predict %s, round %d: %.2f s, peak RSS %.0f MiB", side, r + 1, res["wall_s"], res["peak_rss_mib"])
            runs[side].append(res)
    if not args.no_startup:
        start["ours"] = _ours(folder, one, tmp / "ours_one.jsonl", env, tmp)
        start["transformers"] = _theirs(folder, one, tmp / "transformers_one.jsonl", env, tmp, args.threads)
    n = len(sentences)
    result = {"benchmark": "predict ner", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "model": what,
              "sentences": n, "batch": BATCH, "threads": args.threads, "rounds": args.rounds,
              "same_entities": same_entities(tmp / "ours.jsonl", tmp / "transformers.jsonl"),
              "lines_split_in_sentences": multi_sentence_lines(sentences)}
    for side, rs in runs.items():
        best = min(rs, key=lambda x: x["wall_s"])
        entry = {"wall_s": [x["wall_s"] for x in rs], "best_wall_s": best["wall_s"], "sentences_per_s": n / best["wall_s"],
                 "peak_rss_mib": max(x["peak_rss_mib"] for x in rs)}
        if "phases_s" in best:
            entry["phases_s"] = best["phases_s"]
        if side in start:
            s = start[side]["wall_s"]
            entry["startup_s"] = s
            entry["after_startup_sentences_per_s"] = (n - 1) / (best["wall_s"] - s) if best["wall_s"] > s else None
        result[side] = entry
    o, t = result["ours"], result["transformers"]
    result["ratio_sentences_per_s"] = o["sentences_per_s"] / t["sentences_per_s"]
    if o.get("after_startup_sentences_per_s") and t.get("after_startup_sentences_per_s"):
        result["ratio_after_startup"] = o["after_startup_sentences_per_s"] / t["after_startup_sentences_per_s"]
    return result


def summary_lines(res: dict) -> list[str]:
    o, t = res["ours"], res["transformers"]
    lines = [f"predict ner ({res['sentences']:,} sentences, batch {res['batch']}, {res['threads']} thread(s), "
             f"whole process): ours {o['sentences_per_s']:.1f} sentences/s, transformers {t['sentences_per_s']:.1f} "
             f"sentences/s, ratio {res['ratio_sentences_per_s']:.2f}x",
             f"predict ner peak RSS: ours {o['peak_rss_mib']:.0f} MiB, transformers {t['peak_rss_mib']:.0f} MiB"]
    if "startup_s" in o:
        after = (f", ratio {res['ratio_after_startup']:.2f}x" if "ratio_after_startup" in res else "")
        rate = lambda v: f"{v:.1f}" if v else "n/a (the whole run was no longer than start-up)"  # noqa: E731
        lines.append(f"predict ner start-up (one sentence): ours {o['startup_s']:.1f} s, transformers "
                     f"{t['startup_s']:.1f} s; after start-up: ours {rate(o['after_startup_sentences_per_s'])}, "
                     f"transformers {rate(t['after_startup_sentences_per_s'])} sentences/s{after}")
    lines.append(f"predict ner same entities as the pipeline: {100 * res['same_entities']:.1f}% of lines "
                 f"({res['lines_split_in_sentences']} line(s) our splitter cuts into sentences may differ; model: "
                 f"{res['model']})")
    return lines


def run(args: argparse.Namespace) -> int:
    from bio_megatron.utils.io import check_output_file, write_json_atomic

    check_common(args)
    if args.json:
        check_output_file(args.json)
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        res = measure(args, Path(tmp))
    if args.json:
        write_json_atomic(args.json, res)
    sys.stdout.write("".join(line + "\n" for line in summary_lines(res)))
    return 0
