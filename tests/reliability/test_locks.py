"""One writer per output: a second run is refused at once, and a crashed holder never blocks a rerun.

Found on main before issue 11: two ``data tokenize`` runs into one prefix -- the second deleted the
first's shards while the first kept writing, and one exited 0 with a dataset matching neither input.
These tests use real processes: the first tokenize is frozen with SIGSTOP while it holds the lock (so
the race is deterministic, with no sleeps in library code), the second must exit 2 naming the holder,
and the first, resumed, must produce the very bytes of a solo run.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from reliability.files import tree_digest
from bio_megatron.corpus.pmc import extract_pmc
from bio_megatron.corpus.pubmed import extract_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.corpus.tokenize import tokenize_corpus
from bio_megatron.utils.errors import LockError
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.vocab.builtin import resolve_vocab

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The bundled real sample, repeated so that a run has many shards (--shard-lines 20)."""
    d = tmp_path_factory.mktemp("lockcorpus")
    extract_pubmed(sample_files()["pubmed"], d / "pubmed.jsonl")
    extract_pmc(sample_files()["pmc"], d / "pmc.jsonl")
    out = d / "all.jsonl"
    out.write_text(((d / "pubmed.jsonl").read_text() + (d / "pmc.jsonl").read_text()) * 6)
    return out


@pytest.fixture(scope="module")
def solo(corpus, tmp_path_factory) -> dict[str, str]:
    """sha256 of .bin/.idx from an undisturbed run."""
    prefix = tmp_path_factory.mktemp("solo") / "p"
    tokenize_corpus(corpus, resolve_vocab("bert-base-cased"), prefix, workers=1, shard_lines=20)
    return {ext: hashlib.sha256(Path(f"{prefix}{ext}").read_bytes()).hexdigest() for ext in (".bin", ".idx")}


def _start_tokenize(corpus: Path, prefix: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bio_megatron", "data", "tokenize", "--input", str(corpus),
                             "--vocab", "bert-base-cased", "--output-prefix", str(prefix), "--workers", "1",
                             "--shard-lines", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_until_locked(proc: subprocess.Popen, lock: Path, timeout: float = 120.0) -> None:
    """Until ``lock`` names ``proc`` as its holder (written only once the flock is taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(lock.read_text()).get("pid") == proc.pid:
                return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            pytest.fail(f"first tokenize ended (rc {proc.returncode}) before it was seen holding the lock: "
                        f"{proc.stderr.read()[-2000:]}")
        time.sleep(0.005)
    pytest.fail("first tokenize never took the lock")


def _outputs(prefix: Path) -> dict[str, str]:
    return {ext: hashlib.sha256(Path(f"{prefix}{ext}").read_bytes()).hexdigest() for ext in (".bin", ".idx")}


def test_second_tokenize_into_a_busy_prefix_is_refused(tmp_path, corpus, solo):
    prefix = tmp_path / "out" / "p"
    lock = Path(f"{prefix}.lock")
    first = _start_tokenize(corpus, prefix)
    try:
        _wait_until_locked(first, lock)
        os.kill(first.pid, signal.SIGSTOP)  # hold it mid-run, whatever the machine's speed
        during = tree_digest(tmp_path)
        second = _start_tokenize(corpus, prefix)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 2
        assert (f"{lock}: output prefix {prefix} is in use by PID {first.pid} on host {socket.gethostname()} "
                "(since ") in err
        assert "wait for it or choose another output" in err and "Traceback" not in err
        assert tree_digest(tmp_path) == during  # the refused run touched none of the first run's files
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-2000:]
    assert _outputs(prefix) == solo
    assert json.loads(out)["documents"] > 0
    assert not lock.exists() and not Path(f"{prefix}.shards").exists()


def test_a_killed_holder_does_not_block_a_rerun(tmp_path, corpus, solo):
    prefix = tmp_path / "p"
    lock = Path(f"{prefix}.lock")
    first = _start_tokenize(corpus, prefix)
    _wait_until_locked(first, lock)
    first.kill()  # SIGKILL: no cleanup code runs; the lock file stays with the dead PID in it
    first.wait()
    first.stdout.close()
    first.stderr.close()
    assert json.loads(lock.read_text())["pid"] == first.pid
    assert not Path(f"{prefix}.bin").exists()
    rerun = _start_tokenize(corpus, prefix)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    assert _outputs(prefix) == solo
    assert not lock.exists()


@pytest.mark.parametrize("step", ["pubmed", "pmc"])
def test_extraction_into_a_busy_output_is_refused(tmp_path, step):
    out = tmp_path / f"{step}.jsonl"
    out.write_text("an earlier output\n")
    before = tree_digest(tmp_path)
    # flock belongs to the open file, so a second open in this same process conflicts like another process
    with exclusive_lock(f"{out}.lock", "a test holding the output"):
        rc, msg = run_cli(["data", step, "--input", *map(str, sample_files()[step]), "--output", str(out),
                              "--workers", "1"])
        assert rc == 2
        assert msg == (f"{out}.lock: output {out} is in use by PID {os.getpid()} on host {socket.gethostname()} "
                       f"(since {json.loads(Path(f'{out}.lock').read_text())['since']}); "
                       "wait for it or choose another output")
    assert tree_digest(tmp_path) == before
    assert not Path(f"{out}.lock").exists()  # released and removed on a clean exit


def test_lock_is_reentrant_for_nobody(tmp_path):
    lock = tmp_path / "d" / ".lock"  # parent folders are created, as for a new run directory
    with exclusive_lock(lock, "run directory d"):
        with pytest.raises(LockError, match=rf"run directory d is in use by PID {os.getpid()} on host "):
            with exclusive_lock(lock, "run directory d"):
                pass
        assert lock.exists()
    with exclusive_lock(lock, "run directory d"):  # free again after release
        pass
