"""Never touch what we did not write (issue 21, item 1): lock files, file outputs, folder overwrite, run folders.

Each case was tried on main before issue 21 and lost or risked the user's data: a symlink at ``<prefix>.lock``
had its target truncated and then deleted; a user's own ``run.lock`` was clobbered; ``--out`` equal to an input
(through a hard link or a symlink) replaced the input; ``--out /etc/...`` was written; a file the user added to
an export folder was deleted by ``--overwrite``; ``exp_manager.name=../x`` wrote outside ``exp_dir``; a
pretraining run went into a folder of unrelated files. Every test checks the exit code, the one-line message
and that the user's bytes (sha256) are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from reliability.files import tree_digest
from bio_megatron.corpus.pubmed import extract_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.utils.lock import exclusive_lock

VICTIM_TEXT = "the user's precious file\n"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    """The bundled real PubMed sample as our JSONL (what tokenize and vocab train read)."""
    out = tmp_path_factory.mktemp("docs") / "pubmed.jsonl"
    extract_pubmed(sample_files()["pubmed"], out)
    return out


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


# --- lock files ----------------------------------------------------------------------------------------------

def _tokenize(docs: Path, prefix: Path) -> tuple[int, str]:
    return run_cli(["data", "tokenize", "--input", str(docs), "--vocab", "bert-base-cased",
                    "--output-prefix", str(prefix), "--workers", "1"])


def test_symlinked_tokenize_lock_leaves_its_target_alone(tmp_path, docs, victim):
    prefix = tmp_path / "out" / "p"
    prefix.parent.mkdir()
    lock = Path(f"{prefix}.lock")
    lock.symlink_to(victim)
    before = _sha(victim)
    rc, msg = _tokenize(docs, prefix)
    assert rc == 2, msg
    assert str(lock) in msg and "symbolic link" in msg and "not a lock file" in msg, msg
    assert _sha(victim) == before and lock.is_symlink()  # neither truncated nor deleted, the link kept
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["p.lock"]  # nothing else written


def test_user_file_at_tokenize_lock_is_not_clobbered(tmp_path, docs):
    prefix = tmp_path / "p"
    lock = Path(f"{prefix}.lock")
    lock.write_text("my lock-picking notes\n")
    rc, msg = _tokenize(docs, prefix)
    assert rc == 2 and str(lock) in msg and "holds something else" in msg, msg
    assert lock.read_text() == "my lock-picking notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.lock"]


def test_empty_user_file_at_extraction_lock_is_not_removed(tmp_path):
    out = tmp_path / "pubmed.jsonl"
    lock = Path(f"{out}.lock")
    lock.touch()  # an empty file: a lock of ours is never empty, so this is not one
    rc, msg = run_cli(["data", "pubmed", "--input", *map(str, sample_files()["pubmed"]), "--output", str(out),
                       "--workers", "1"])
    assert rc == 2 and str(lock) in msg, msg
    assert lock.exists() and lock.read_bytes() == b"" and not out.exists()


def test_symlinked_extraction_lock_leaves_its_target_alone(tmp_path, victim):
    out = tmp_path / "pmc.jsonl"
    Path(f"{out}.lock").symlink_to(victim)
    rc, msg = run_cli(["data", "pmc", "--input", *map(str, sample_files()["pmc"]), "--output", str(out),
                       "--workers", "1"])
    assert rc == 2 and "symbolic link" in msg, msg
    assert victim.read_text() == VICTIM_TEXT and not out.exists()


def test_stale_lock_of_a_crashed_run_is_reused_and_removed(tmp_path):
    lock = tmp_path / "p.lock"
    record = {"pid": 999999999, "host": "gone", "since": "2020-01-01T00:00:00", "command": "x"}
    lock.write_text(json.dumps(record) + "\n" + " " * 300)  # longer than a fresh record: rewritten in place
    with exclusive_lock(lock, "output prefix p"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_release_never_removes_a_file_that_replaced_the_lock(tmp_path):
    lock = tmp_path / "run.lock"
    with exclusive_lock(lock, "run directory x"):
        os.unlink(lock)
        lock.write_text("the user's file, put here while we ran\n")
    assert lock.read_text() == "the user's file, put here while we ran\n"
