"""``predict ner`` over a corpus (issue 25 item 4): the input read lazily, windows written in input order as they
finish (to ``<out>.partial``, renamed onto ``--out`` at the end), ``--workers N`` processes, and a rerun after a
kill continuing where the first stopped. The output equals today's one-shot ``predict_documents`` output (same
entities; scores to float rounding) for any window size and worker count.

One seeded tiny BERT token-classification folder (``bench``'s, the one test_bench_predict.py uses: its head tags a
real mixture) on ~100 documents of real BC5CDR sentences; every CLI run is the real command.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from harness import run_world
from reliability.cli_log import run_cli
from reliability.files import tree_digest

ROOT = Path(__file__).resolve().parents[2]
NER_DEV = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv"
CLI = Path(sys.executable).parent / "bio-megatron"


def _documents() -> list[str]:
    from bio_megatron.corpus.iob import read_iob

    sents = [" ".join(s.words) for s in read_iob(NER_DEV)]
    docs, k = [], 0
    while k < len(sents):  # 1, 2 and 3 sentences per document, two blank ones: windows cut across all of them
        n = 1 + len(docs) % 3
        docs.append(" ".join(sents[k:k + n]))
        k += n
    docs[3:3] = ["", "   "]
    return docs


def _reference(model: str, docs_file: str) -> list[dict]:
    """Today's one-shot output: every document through ``predict_documents`` in one call."""
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict.ner import predict_documents, read_documents

    single_process()
    loaded = load_finetuned(model, "ner")
    return [{"id": i, "entities": e} for i, e in predict_documents(loaded, list(read_documents(docs_file)))]


def _cli_runs(runs: list[list[str]]) -> list[dict]:
    out = []
    for argv in runs:
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            rc, msg = run_cli(argv, level=logging.INFO, sep="\n")
        out.append({"rc": rc, "msg": msg, "stdout": stdout.getvalue()})
    return out


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def _assert_same(mine: list[dict], ref: list[dict]) -> None:
    assert [r["id"] for r in mine] == [r["id"] for r in ref]  # one record per document, in input order
    for a, b in zip(mine, ref):
        assert [(e["type"], e["start"], e["end"], e["text"]) for e in a["entities"]] == \
            [(e["type"], e["start"], e["end"], e["text"]) for e in b["entities"]], a["id"]
        assert all(abs(x["score"] - y["score"]) < 1e-5 for x, y in zip(a["entities"], b["entities"])), a["id"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    from bio_megatron.bench.hf_models import task_folder

    tmp = tmp_path_factory.mktemp("predict_stream")
    model, _ = task_folder(None, "token", ["O", "B-Chemical", "I-Chemical"], tmp)
    docs = tmp / "docs.txt"
    docs.write_text("".join(d + "\n" for d in _documents()), encoding="utf-8")
    (ref,) = run_world(1, _reference, str(model), str(docs), timeout=300)
    assert sum(len(r["entities"]) for r in ref) >= 30  # the seeded head tags a real mixture: comparisons bite
    return {"model": model, "docs": docs, "ref": ref, "tmp": tmp}


def test_streamed_output_equals_one_shot_for_any_window_and_worker_count(corpus):
    tmp, model, docs = corpus["tmp"], str(corpus["model"]), str(corpus["docs"])
    outs = {name: tmp / f"{name}.jsonl" for name in ("w3", "w7x2")}
    base = ["predict", "ner", "--checkpoint", model, "--input", docs]
    (res,) = run_world(1, _cli_runs, [base + ["--out", str(outs["w3"]), "--window", "3"],
                                      base + ["--out", str(outs["w7x2"]), "--window", "7", "--workers", "2"],
                                      base + ["--window", "4"]],  # to stdout: streamed as it comes
                       timeout=300)
    assert [r["rc"] for r in res] == [0, 0, 0], res
    _assert_same([json.loads(x) for x in res[2]["stdout"].splitlines()], corpus["ref"])
    for r in res:  # progress lines with the rate and an ETA, then the summary
        assert "sentences/s, ETA" in r["msg"] and f"{len(corpus['ref'])} documents, " in r["msg"], r["msg"]
    assert "2 worker processes (forkserver)" in res[1]["msg"], res[1]["msg"]  # one import for the pool, not two
    for out in outs.values():
        _assert_same(_records(out), corpus["ref"])
        assert not Path(f"{out}.partial").exists() and not Path(f"{out}.partial.state").exists()


def _cli_run_seeing_a_gpu(argv: list[str]) -> dict:
    """The CLI as on a machine with a GPU: torch.cuda.is_available() is True in this forked process only (spawned
    workers are fresh interpreters and see the machine as it is)."""
    import torch

    torch.cuda.is_available = lambda: True
    (res,) = _cli_runs([argv])
    return res


def test_workers_are_fresh_processes_where_there_is_a_gpu(corpus):
    """On a GPU machine the fork server cannot serve: importing megatron-core there initialises CUDA, and its forks
    could not use the GPU. The workers are spawned instead (each picks GPU index % count), with the same output."""
    out = corpus["tmp"] / "spawned.jsonl"
    (res,) = run_world(1, _cli_run_seeing_a_gpu, ["predict", "ner", "--checkpoint", str(corpus["model"]), "--input",
                                                  str(corpus["docs"]), "--out", str(out), "--workers", "2"],
                       timeout=300)
    assert res["rc"] == 0 and "2 worker processes (spawn)" in res["msg"], res["msg"]
    _assert_same(_records(out), corpus["ref"])


def _partial_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_a_killed_run_continues_to_the_uninterrupted_output_and_refuses_other_inputs(corpus):
    tmp, model, docs = corpus["tmp"], str(corpus["model"]), corpus["docs"]
    work = tmp / "kill"
    work.mkdir()
    inp, out = work / "docs.txt", work / "ents.jsonl"
    inp.write_bytes(docs.read_bytes())
    partial = Path(f"{out}.partial")
    argv = ["predict", "ner", "--checkpoint", model, "--input", str(inp), "--out", str(out), "--window", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(CLI), *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while _partial_lines(partial) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    err = proc.stderr.read().decode()
    assert proc.returncode == -signal.SIGKILL, err  # killed, not finished
    done = _partial_lines(partial)
    assert 1 <= done < len(corpus["ref"]) and not out.exists(), (done, err)
    with open(partial, "ab") as fh:  # a line torn by the kill (as a kill inside write() leaves one)
        fh.write(b'{"id": "9999", "entit')

    before = {k: v for k, v in tree_digest(work).items() if k != "docs.txt"}  # the partial and its state
    original = inp.read_bytes()
    inp.write_bytes(original.replace(b"the", b"The", 1))  # same path, same size, another content
    other = tmp / "other_model"
    shutil.copytree(model, other)
    (res,) = run_world(1, _cli_runs, [argv, [*argv[:3], str(other), *argv[4:]]], timeout=300)
    assert res[0]["rc"] == 2 and f"--input {inp} changed" in res[0]["msg"] and "--overwrite" in res[0]["msg"], res
    inp.write_bytes(original)
    assert res[1]["rc"] == 2 and "another checkpoint" in res[1]["msg"], res
    assert {k: v for k, v in tree_digest(work).items() if k != "docs.txt"} == before  # refused: nothing touched

    (res,) = run_world(1, _cli_runs, [argv], timeout=300)  # same input back (a new mtime is no difference)
    assert res[0]["rc"] == 0, res
    _assert_same(_records(out), corpus["ref"])
    assert not partial.exists() and not Path(f"{out}.partial.state").exists()


def test_a_partial_file_that_is_not_ours_is_refused_and_kept(corpus, tmp_path):
    out = tmp_path / "ents.jsonl"
    partial = Path(f"{out}.partial")
    partial.write_text("my notes\n")
    rc, msg = run_cli(["predict", "ner", "--checkpoint", str(corpus["model"]), "--input", str(corpus["docs"]),
                       "--out", str(out), "--overwrite"])
    assert rc == 2 and f"{partial}: exists but was not written by `predict ner`" in msg, msg
    assert partial.read_text() == "my notes\n" and not out.exists()


def _pull_ahead(model: str, workers: int) -> dict:
    """How many documents a streamed run has pulled from its input when its first windows come out."""
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict import stream
    from bio_megatron.predict.ner import predict_window, sentence_count

    pulled = 0

    def docs():
        nonlocal pulled
        for i in range(200_000):
            pulled += 1
            yield str(i), "Cisplatin induced nephrotoxicity in rats ."

    loaded = None
    if workers == 1:
        single_process()
        loaded = load_finetuned(model, "ner")
    seen = []
    results = stream.stream_predictions(docs(), window=50, workers=workers, checkpoint=model, batch_size=32,
                                        count=sentence_count, tag=lambda win: predict_window(loaded, win))
    server = None
    for win, res, _ in results:
        seen.append((len(win), pulled, [i for i, _ in res]))
        if server is None and workers > 1:
            server = _fork_server()
        if len(seen) == 3:
            break
    results.close()  # stops the workers
    return {"seen": seen, "server": server}


def _fork_server() -> dict:
    """The fork server the workers came from: its threads, whether it holds torch's library, and its children."""
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid  # set once the server is started; None without one
    if pid is None:
        return {"pid": None}
    maps = Path(f"/proc/{pid}/maps").read_text()
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {"pid": pid, "threads": len(os.listdir(f"/proc/{pid}/task")), "torch": "libtorch_cpu.so" in maps,
            "children": len(children)}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_200k_document_input_is_pulled_one_window_at_a_time(corpus, workers):
    """Laziness checked structurally: a generator of 200,000 documents has given out at most the windows in
    flight (1, or 2 x workers, of 50 documents) plus one when the first windows come back; the windows come back
    in input order. (It proves the pipeline holds no full list; the reader itself: the next test.)"""
    (res,) = run_world(1, _pull_ahead, str(corpus["model"]), workers, timeout=300)
    ahead = 1 if workers == 1 else 2 * workers
    for n, (size, pulled, ids) in enumerate(res["seen"]):
        assert size == 50 and ids == [str(i) for i in range(50 * n, 50 * n + 50)]
        assert pulled <= 50 * (n + ahead), res["seen"]
    if workers > 1:
        # The workers are forked from one fork server that imported torch (and megatron-core, the loader) once and
        # still has its single thread: no torch thread pool existed to be forked (stream.py's fork-safety reason).
        assert res["server"]["pid"] is not None and res["server"]["torch"], res["server"]
        assert res["server"]["threads"] == 1 and res["server"]["children"] == workers, res["server"]


def test_reading_and_scanning_a_200k_line_input_holds_no_list_of_it(tmp_path):
    """The CLI's pre-pass (``scan`` over ``read_documents``) keeps nothing: Python's peak traced allocation while
    it reads 200,000 lines stays under 1 MB (a list of them would hold over 20 MB)."""
    from bio_megatron.predict.ner import read_documents
    from bio_megatron.predict.stream import scan

    big = tmp_path / "big.txt"
    big.write_text("".join(f"Cisplatin induced nephrotoxicity in rat {i} .\n" for i in range(200_000)))
    tracemalloc.start()
    try:
        n, size = scan(read_documents(big))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 200_000 and size == big.stat().st_size - n
    assert peak < 1_000_000, peak
