"""``predict ner`` over a corpus: documents read lazily, tagged window by window (in this process or in ``--workers``
processes, each with its own copy of the model), written as JSON lines in input order as each window finishes.

With ``--out`` the lines go to ``<out>.partial`` (appended, flushed and fsynced per window) beside a small state
record ``<out>.partial.state`` (the input's size, mtime and sha256, the checkpoint's identity, the documents done);
the finished file is renamed onto ``--out``. A rerun with the same input and checkpoint continues after the last
complete document of ``<out>.partial`` (a torn last line is dropped); another input or checkpoint is refused naming
what differs (``--overwrite`` starts over). To stdout the lines are streamed as they come, with no resume.

Memory stays bounded by the window: at most ``2 x workers`` windows are read ahead of the one being written, and no
list of all documents or sentences is ever built.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from bio_megatron import __version__
from bio_megatron.utils.errors import BioMegatronError, DataError, OutputError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger()

COMMAND = "predict ner"
Doc = tuple[str, str]            # (id, text)
Result = tuple[str, list[dict]]  # (id, entities)


def partial_paths(out: str | os.PathLike) -> tuple[Path, Path]:
    """``<out>.partial`` (the lines written so far) and ``<out>.partial.state`` (what they were computed from)."""
    return Path(f"{out}.partial"), Path(f"{out}.partial.state")


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def input_identity(path: str | os.PathLike) -> dict:
    """What the input was: a resumed run must read the same bytes, or its first lines would belong to another file."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(path)}


def model_identity(path: str | os.PathLike) -> dict:
    """The checkpoint as a listing of its files (name, size, mtime): hashing gigabytes of weights per run would cost
    more than the check is worth, and a replaced or re-saved file changes its size or mtime."""
    root = Path(path).resolve()
    listing = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = Path(dirpath) / name
            try:
                st = full.stat()
            except OSError:
                continue
            listing.append(f"{full.relative_to(root).as_posix()}\t{st.st_size}\t{st.st_mtime_ns}")
    if root.is_file():
        st = root.stat()
        listing.append(f"\t{st.st_size}\t{st.st_mtime_ns}")
    return {"path": str(root), "files_sha256": hashlib.sha256("\n".join(listing).encode()).hexdigest()}


def _differences(saved: dict, now: dict) -> list[str]:
    """What differs between the run that wrote ``<out>.partial`` and this one (the mtime alone is no difference:
    a copy or a ``touch`` of the same bytes continues)."""
    what = []
    old, new = saved.get("input") or {}, now["input"]
    if old.get("path") != new["path"]:
        what.append(f"--input {new['path']} is another file (was {old.get('path')})")
    elif (old.get("size"), old.get("sha256")) != (new["size"], new["sha256"]):
        what.append(f"--input {new['path']} changed (size {old.get('size')} -> {new['size']}, sha256 "
                    f"{str(old.get('sha256'))[:12]} -> {new['sha256'][:12]})")
    old, new = saved.get("checkpoint") or {}, now["checkpoint"]
    if old.get("path") != new["path"]:
        what.append(f"--checkpoint {new['path']} is another checkpoint (was {old.get('path')})")
    elif old.get("files_sha256") != new["files_sha256"]:
        what.append(f"--checkpoint {new['path']}: its files changed since")
    return what


def resume_state(out: str | os.PathLike, identity: dict, overwrite: bool) -> bool:
    """Whether ``<out>.partial`` of an earlier run of the same input and checkpoint is there to continue; an
    earlier run of something else is refused naming what differs (``overwrite``: discarded, start over). A
    ``.partial`` without our state record is not ours and is never removed."""
    partial, state = partial_paths(out)
    if not partial.exists() and not state.exists():
        return False
    try:
        saved = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict) or saved.get("command") != COMMAND:
        raise OutputError(f"{partial}: exists but was not written by `{COMMAND}` (no state record {state.name}); "
                          "refusing to touch it: move it away or choose another --out")
    if overwrite:
        log.info("--overwrite: starting over, discarding %s", partial)
        partial.unlink(missing_ok=True)
        state.unlink()
        return False
    differs = _differences(saved, identity)
    if differs:
        raise OutputError(f"{partial}: an unfinished `{COMMAND}` of other inputs: " + "; ".join(differs)
                          + "; rerun with the same --input and --checkpoint to continue it, or pass --overwrite "
                          "to start over")
    return partial.exists()


def skip_done(partial: Path, docs: Iterator[Doc]) -> tuple[int, int]:
    """Consume from ``docs`` the documents ``partial`` already holds and cut ``partial`` after the last complete
    line (a line cut by a kill, and everything after it, is dropped); returns the documents and text bytes done."""
    done, keep, text_bytes = 0, 0, 0
    with open(partial, "r+b") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break
            try:
                rec = json.loads(raw)
            except ValueError:
                break
            doc = next(docs, None)
            if doc is None or not isinstance(rec, dict) or rec.get("id") != doc[0]:
                raise DataError(f"line {done + 1} of the unfinished output is not document {done + 1} of the input "
                                "(same size and sha256): it was edited; pass --overwrite to start over", str(partial))
            done += 1
            keep += len(raw)
            text_bytes += len(doc[1].encode("utf-8"))
        if keep != fh.seek(0, os.SEEK_END):
            log.warning("%s: dropping %d byte(s) after the last complete document", partial, fh.tell() - keep)
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return done, text_bytes


def windows(docs: Iterable[Doc], size: int, count: Callable[[str], int]) -> Iterator[tuple[list[Doc], int]]:
    """``(documents, their sentences)``: consecutive documents holding ``size`` sentences (by ``count``) or ``size``
    documents, whichever comes first (a run of blank lines must not grow one window without limit)."""
    pending: list[Doc] = []
    sents = 0
    for doc in docs:
        pending.append(doc)
        sents += count(doc[1])
        if sents >= size or len(pending) >= size:
            yield pending, sents
            pending, sents = [], 0
    if pending:
        yield pending, sents


@dataclass
class Progress:
    """Documents, sentences and text bytes done; sentences/s and an ETA from the text bytes done vs the total."""
    total_docs: int
    total_bytes: int
    every_s: float = 5.0
    docs: int = 0        # documents done, those of an earlier run included
    sents: int = 0       # sentences tagged by this run
    done_bytes: int = 0  # text bytes done, those of an earlier run included

    def __post_init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.first = True
        self.start_bytes = self.done_bytes  # the rate and ETA count this run's work only

    def add(self, docs: list[Doc], sents: int) -> None:
        self.docs += len(docs)
        self.sents += sents
        self.done_bytes += sum(len(t.encode("utf-8")) for _, t in docs)
        now = time.monotonic()
        if self.first or now - self.last >= self.every_s:
            self.first, self.last = False, now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        spent = max(now - self.start, 1e-9)
        rate = self.sents / spent
        left, ran = self.total_bytes - self.done_bytes, self.done_bytes - self.start_bytes
        eta = spent * left / ran if ran else float("nan")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
        return (f"predict ner: {self.docs:,}/{self.total_docs:,} documents, {self.sents:,} sentences, "
                f"{rate:,.1f} sentences/s, ETA {eta_text}")


PRELOAD = "bio_megatron.predict.pool_preload"


def _context():
    """The workers' start method. Not ``fork``: a fork after torch's thread pools started can hang the child, and
    the parent (or a test process forking it) may well have run torch. ``forkserver``: one fresh interpreter that
    imports torch, megatron-core and the loader once (:mod:`.pool_preload`, no torch operation run, one thread)
    and forks every worker from there, so a pool of N costs one import instead of N ``spawn`` ones. ``spawn`` where
    the platform has no fork server, and where torch sees a GPU (the fork server's children could not use it:
    ``parallel.distributed.forks_can_use_the_device``)."""
    import multiprocessing as mp

    from bio_megatron.parallel.distributed import forks_can_use_the_device

    if "forkserver" not in mp.get_all_start_methods() or not forks_can_use_the_device():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def start_worker_server(workers: int) -> None:
    """Start the fork server now (``workers`` > 1), so that its imports run beside this process's own rather than
    after them; a no-op with one worker, with ``spawn``, or when it already runs."""
    if workers > 1 and _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


class _Workers:
    """``n`` processes, each loading the model once and tagging whole windows; results come back in window order."""

    def __init__(self, n: int, checkpoint: str, batch_size: int) -> None:
        import torch

        ctx = _context()
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        threads = max(1, torch.get_num_threads() // n)  # the cores are shared: one worker's torch threads each
        self.procs = [ctx.Process(target=_worker, args=(checkpoint, batch_size, threads, self.tasks, self.results, i),
                                  daemon=True) for i in range(n)]
        for p in self.procs:
            p.start()
        log.info("predict ner: %d worker processes (%s), %d torch thread(s) each", n, ctx.get_start_method(), threads)

    def run(self, wins: Iterable[tuple[list[Doc], int]]) -> Iterator[tuple[list[Doc], list[Result], int]]:
        ahead = 2 * len(self.procs)  # windows in flight: enough to keep every worker busy, few enough to stay small
        it = iter(wins)
        sent: dict[int, tuple[list[Doc], int]] = {}
        done: dict[int, list[Result]] = {}
        nxt, k = 0, 0
        exhausted = False
        while True:
            while not exhausted and len(sent) < ahead:
                win = next(it, None)
                if win is None:
                    exhausted = True
                    break
                sent[k] = win
                self.tasks.put((k, win[0]))
                k += 1
            if nxt not in sent:
                return
            while nxt not in done:
                self._collect(done)
            win, sents = sent.pop(nxt)
            yield win, done.pop(nxt), sents
            nxt += 1

    def _collect(self, done: dict[int, list[Result]]) -> None:
        try:
            k, status, value = self.results.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"predict ner: worker process {dead[0].pid} died (exit code {dead[0].exitcode})")
            return
        if status == "error":
            kind, message = value
            if kind == "user":
                raise BioMegatronError(message)
            raise RuntimeError(f"a predict ner worker failed:\n{message}")
        done[k] = value

    def close(self, now: bool = False) -> None:
        if now:  # killed workers never read what is left: do not wait at exit to flush it to them
            self.tasks.cancel_join_thread()
        for _ in self.procs:
            self.tasks.put(None)
        for p in self.procs:
            p.join(timeout=0 if now else 30)
            if p.is_alive():
                p.kill()
                p.join()


def _worker(checkpoint: str, batch_size: int, threads: int, tasks, results, index: int) -> None:
    """One worker: its own one-process world (not the launcher's ranks: each worker is a world of one), on GPU
    ``index`` modulo the machine's count where there are GPUs (not every worker on the first), the model loaded
    once, then whole windows until told to stop."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        os.environ.pop(key, None)
    import torch

    torch.set_num_threads(threads)
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process, teardown
    from bio_megatron.predict.ner import predict_window

    try:
        single_process(local_rank=index)
        loaded = load_finetuned(checkpoint, "ner")
        while (task := tasks.get()) is not None:
            k, docs = task
            results.put((k, "ok", predict_window(loaded, docs, batch_size)))
    except Exception as exc:  # the parent raises it: a user's error (bad checkpoint) stays one line, exit 2
        user = isinstance(exc, BioMegatronError)
        results.put((-1, "error", ("user" if user else "bug", str(exc) if user else traceback.format_exc())))
    finally:
        teardown()


def stream_predictions(docs: Iterable[Doc], *, window: int, workers: int, checkpoint: str, batch_size: int,
                       count: Callable[[str], int], tag: Callable[[list[Doc]], list[Result]] | None,
                       ) -> Iterator[tuple[list[Doc], list[Result], int]]:
    """``(window's documents, their results, their sentence count)`` in input order: tagged by ``tag`` in this
    process (``workers`` 1) or by ``workers`` processes."""
    wins = windows(docs, window, count)
    if workers <= 1:
        for win, sents in wins:
            yield win, tag(win), sents
        return
    pool = _Workers(workers, checkpoint, batch_size)
    try:
        yield from pool.run(wins)
    except BaseException:
        pool.close(now=True)  # the windows still in flight are of no use any more
        raise
    pool.close()


def write_stream(results: Iterable[tuple[list[Doc], list[Result], int]], progress: Progress, out: str | None,
                 state: dict | None) -> None:
    """Each window's JSON lines to stdout, or appended to ``<out>.partial`` (fsynced, then the state record
    updated); when all are written, ``<out>.partial`` is renamed onto ``out`` and the state record removed."""
    if out is None:
        for win, res, sents in results:
            sys.stdout.write("".join(json.dumps({"id": i, "entities": e}) + "\n" for i, e in res))
            sys.stdout.flush()
            progress.add(win, sents)
        _summary(progress, "stdout")
        return
    partial, state_path = partial_paths(out)
    fh: IO[bytes] | None = None
    try:
        for win, res, sents in results:
            if fh is None:  # opened with the first window: a run that fails to load its model leaves nothing
                write_json_atomic(state_path, {**state, "documents_done": progress.docs})  # the record first: a
                fh = open(partial, "ab")  # .partial without one is never ours
            fh.write("".join(json.dumps({"id": i, "entities": e}) + "\n" for i, e in res).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
            progress.add(win, sents)
            write_json_atomic(state_path, {**state, "documents_done": progress.docs})
    finally:
        if fh is not None:
            fh.close()
    partial.touch()  # resumed after its last window was written: nothing left to add
    if Path(out).is_dir():
        raise OutputError(f"{out}: is a folder; a file path is expected")
    os.replace(partial, out)
    state_path.unlink(missing_ok=True)
    _summary(progress, str(out))


def _summary(progress: Progress, where: str) -> None:
    spent = max(time.monotonic() - progress.start, 1e-9)
    log.info("predict ner: %s documents, %s sentences in %.1f s (%.1f sentences/s) -> %s", f"{progress.docs:,}",
             f"{progress.sents:,}", spent, progress.sents / spent, where)


def scan(docs: Iterable[Doc]) -> tuple[int, int]:
    """Documents and text bytes of the whole input, read once before the model loads: a broken line is refused
    (file and line) before any work, and the totals give the ETA. Nothing is kept."""
    n = size = 0
    for _, text in docs:
        n += 1
        size += len(text.encode("utf-8"))
    return n, size


def new_state(identity: dict) -> dict:
    return {"command": COMMAND, "version": __version__, **identity, "documents_done": 0}
