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


# --- file outputs: never one of the inputs, never a system path ----------------------------------------------

def _link(kind: str, src: Path, dst: Path) -> Path:
    if kind == "hardlink":
        os.link(src, dst)
    else:
        dst.symlink_to(src)
    return dst


def _conll(path: Path) -> Path:
    path.write_text("Naloxone B-Chemical B-Chemical\nreverses O O\nclonidine B-Chemical O\n\n")
    return path


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_predict_out_that_is_the_input_is_refused(tmp_path, kind):
    inp = tmp_path / "docs.txt"
    inp.write_text("Naloxone reverses the antihypertensive effect of clonidine.\n")
    out = _link(kind, inp, tmp_path / "pred.jsonl")
    before = tree_digest(tmp_path)
    # the checkpoint does not exist: the output check must come before anything is loaded
    rc, msg = run_cli(["predict", "ner", "--checkpoint", str(tmp_path / "nope"), "--input", str(inp),
                       "--out", str(out)])
    assert rc == 2 and f"{out}: the output (--out) is the input {inp}" in msg, msg
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_evaluate_json_that_is_the_prediction_file_is_refused(tmp_path, kind):
    gold = tmp_path / "gold.tsv"
    gold.write_text("index\tlabel\n1\tfalse\n2\ttrue\n")
    pred = tmp_path / "pred.tsv"
    pred.write_text("index\tprediction\n1\tfalse\n2\ttrue\n")
    out = _link(kind, pred, tmp_path / "scores.json")
    before = tree_digest(tmp_path)
    rc, msg = run_cli(["evaluate", "gad", "--gold", str(gold), "--pred", str(pred), "--json", str(out)])
    assert rc == 2 and f"{out}: the output (--json) is the input {pred}" in msg, msg
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_vocab_train_output_that_is_the_input_is_refused(tmp_path, docs, kind):
    inp = tmp_path / "docs.jsonl"
    inp.write_bytes(docs.read_bytes())
    out = _link(kind, inp, tmp_path / "vocab.txt")
    before = tree_digest(tmp_path)
    rc, msg = run_cli(["vocab", "train", "--input", str(inp), "--output", str(out), "--size", "200"])
    assert rc == 2 and "is the input" in msg, msg
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_extraction_output_that_is_a_file_of_the_input_folder_is_refused(tmp_path, kind):
    xml = tmp_path / "xml"
    xml.mkdir()
    for f in sample_files()["pubmed"]:
        (xml / Path(f).name).write_bytes(Path(f).read_bytes())
    first = sorted(xml.iterdir())[0]
    out = _link(kind, first, tmp_path / "pubmed.jsonl")
    before = tree_digest(tmp_path)
    rc, msg = run_cli(["data", "pubmed", "--input", str(xml), "--output", str(out), "--workers", "1"])
    assert rc == 2, msg
    assert (f"{out}: the output (--output) is {first}, a file of the input folder {xml}" in msg
            or f"is the input {xml}" in msg), msg
    assert tree_digest(tmp_path) == before


def test_extraction_output_equal_to_its_input_is_refused(tmp_path):
    xml = tmp_path / "a.xml"
    xml.write_bytes(Path(sample_files()["pubmed"][0]).read_bytes())
    before = tree_digest(tmp_path)
    rc, msg = run_cli(["data", "pubmed", "--input", str(xml), "--output", str(xml), "--workers", "1"])
    assert rc == 2 and "is the input" in msg, msg
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("target", ["/", "/etc/passwd", "/etc/bio_megatron_test_never_written.jsonl",
                                    "/usr/bio_megatron_test.jsonl", "/dev/null", "/dev/stdout",
                                    "/etc/../etc/hostname"])
def test_predict_out_in_a_system_path_is_refused(tmp_path, target):
    inp = tmp_path / "docs.txt"
    inp.write_text("Naloxone reverses clonidine.\n")
    watched = Path("/etc/passwd")
    before = _sha(watched)
    etc = sorted(os.listdir("/etc"))
    rc, msg = run_cli(["predict", "ner", "--checkpoint", str(tmp_path / "nope"), "--input", str(inp),
                       "--out", target])
    assert rc == 2 and target in msg and ("system folder" in msg or "root folder" in msg), msg
    assert _sha(watched) == before and sorted(os.listdir("/etc")) == etc  # refused before any write
    assert not Path("/etc/bio_megatron_test_never_written.jsonl").exists()


def test_output_through_a_symlinked_folder_into_etc_is_refused(tmp_path):
    (tmp_path / "results").symlink_to("/etc")
    gold = tmp_path / "gold.tsv"
    gold.write_text("index\tlabel\n1\tfalse\n2\ttrue\n")
    rc, msg = run_cli(["evaluate", "gad", "--gold", str(gold), "--pred", str(gold),
                       "--json", str(tmp_path / "results" / "scores.json")])
    assert rc == 2 and "system folder (/etc)" in msg, msg
    assert not Path("/etc/scores.json").exists()


@pytest.mark.parametrize("argv", [["data", "download", "pubmed", "--out", "/"],
                                  ["vocab", "train", "--type", "bpe", "--input", "x.jsonl", "--output", "/usr"],
                                  ["bench", "pretrain", "--size", "tiny", "--json", "/proc/bench.json"],
                                  ["evaluate", "bioasq-submission", "--nbest", "n.json", "--out", "/boot/x.json"]])
def test_other_outputs_in_system_paths_are_refused(argv):
    rc, msg = run_cli(argv)
    assert rc == 2 and ("root folder" in msg or "system folder" in msg), msg

