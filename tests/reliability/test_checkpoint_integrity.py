"""Damaged checkpoints: reported as one line naming the checkpoint and the file, before anything is loaded;
automatic resume skips a damaged newest checkpoint and continues, exactly, from the previous one.

Each damage case runs the real CLI (``export hf --checkpoint``) in a forked one-rank world and checks the exit
code (2), the message, that no output folder (or temporary sibling) is left, and that the damaged checkpoint
itself is not touched. A checkpoint saved before checksums existed (no ``checksums.json``) still loads, and
its truncation is still found from the shard sizes ``.metadata`` records.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import losses, overrides, pretrain_rank
from reliability.files import tree_digest

STEPS = 4


def _cli_rank(argv: list[str], log: str) -> int:
    """The real ``bio-megatron`` entry point inside a forked rank, its stderr (the log) kept in ``log``."""
    import sys

    from bio_megatron.cli import main

    _log_to(log)
    try:
        return main(argv)
    finally:
        sys.stderr.flush()


def _log_to(log: str) -> None:
    """Point this (forked) process's stderr and the project logger at ``log`` (pytest swapped sys.stderr)."""
    import sys

    from bio_megatron.utils.log import setup_logging

    sys.stderr = open(log, "w", buffering=1)
    os.dup2(sys.stderr.fileno(), 2)
    setup_logging(force=True)


def run_cli(argv: list[str], log: Path) -> tuple[int, str]:
    (rc,) = run_world(1, _cli_rank, argv, str(log))
    return rc, log.read_text()


@pytest.fixture(scope="module")
def tiny_run(pubmed_prefix, tmp_path_factory) -> Path:
    """A 1-rank tiny pretraining with checkpoints at steps 2 (periodic) and 4 (final)."""
    root = tmp_path_factory.mktemp("integrity")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "src", steps=STEPS, every=2, save_last=True))
    ckpts = root / "src" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == str(STEPS)
    assert (ckpts / "iter_0000002" / "checksums.json").is_file()
    return root / "src"


def _copy(tiny_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_run / "checkpoints" / "iter_0000002", dst)
    return dst


def _truncate(path: Path, keep: int) -> None:
    with path.open("r+b") as fh:
        fh.truncate(keep)


def _flip(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


DAMAGE = {
    "truncated_shard": (lambda d: _truncate(d / "__0_0.distcp", os.path.getsize(d / "__0_0.distcp") // 2),
                        "__0_0.distcp has"),
    "flipped_bytes": (lambda d: _flip(d / "__0_0.distcp"), "__0_0.distcp does not match the sha256"),
    "truncated_metadata": (lambda d: _truncate(d / ".metadata", 1000), ".metadata has 1000 bytes"),
    "deleted_shard": (lambda d: (d / "__0_0.distcp").unlink(), "__0_0.distcp is missing"),
}


def _assert_refused(ckpt: Path, out: Path, rc: int, log: str, expected: str) -> None:
    assert rc == 2, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and str(ckpt) in errors[0] and expected in errors[0], log
    assert "Traceback" not in log
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), "a partial output was left"


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_checkpoint_is_refused_naming_the_file(case, tiny_run, tmp_path):
    ckpt = _copy(tiny_run, tmp_path)
    damage, expected = DAMAGE[case]
    damage(ckpt)
    before = tree_digest(ckpt)
    out = tmp_path / "hf"
    rc, log = run_cli(["export", "hf", "--checkpoint", str(ckpt), "--out", str(out)], tmp_path / "log")
    _assert_refused(ckpt, out, rc, log, expected)
    assert tree_digest(ckpt) == before


def test_checkpoint_without_checksums_still_loads_and_truncation_is_still_found(tiny_run, tmp_path):
    ckpt = _copy(tiny_run, tmp_path)
    (ckpt / "checksums.json").unlink()  # as saved before this change
    rc, log = run_cli(["export", "hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")], tmp_path / "log")
    assert rc == 0, log
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    _truncate(ckpt / "__0_0.distcp", os.path.getsize(ckpt / "__0_0.distcp") - 100)
    out = tmp_path / "hf2"
    rc, log = run_cli(["export", "hf", "--checkpoint", str(ckpt), "--out", str(out)], tmp_path / "log")
    _assert_refused(ckpt, out, rc, log, "__0_0.distcp has")


def test_resume_skips_a_damaged_newest_checkpoint(tiny_run, pubmed_prefix, tmp_path):
    ref = losses(tiny_run)
    assert sorted(ref) == list(range(1, STEPS + 1))
    shutil.copytree(tiny_run, tmp_path / "src")  # the same exp_manager.name, in a fresh exp_dir
    ckpts = tmp_path / "src" / "checkpoints"
    _flip(ckpts / "iter_0000004" / "__0_0.distcp")
    older = tree_digest(ckpts / "iter_0000002")
    over = overrides(pubmed_prefix, tmp_path, "src", steps=STEPS, every=2, save_last=True)
    (status,) = run_world(1, _logged_pretrain, over, str(tmp_path / "log"))
    log = (tmp_path / "log").read_text()
    assert status == "finished", log
    warned = [line for line in log.splitlines() if "WARNING" in line and "iter_0000004" in line]
    assert warned and "__0_0.distcp" in warned[0], log
    assert "resumed from" in log and f"{ckpts / 'iter_0000002'} at step 2" in log
    records = [json.loads(line) for line in (tmp_path / "src" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-3:] == [4, 3, 4]  # the rerun trained steps 3 and 4
    got = losses(tmp_path / "src")
    for step in (3, 4):
        assert got[step] == pytest.approx(ref[step], abs=1e-6), (step, got[step], ref[step])
    assert tree_digest(ckpts / "iter_0000002") == older  # the intact checkpoint was only read
    assert (ckpts / "latest").read_text().strip() == "4"
    rc, log = run_cli(["export", "hf", "--checkpoint", str(ckpts), "--out", str(tmp_path / "hf")], tmp_path / "log2")
    assert rc == 0, log  # the re-saved step 4 is whole again


def _logged_pretrain(over: list[str], log: str) -> str:
    _log_to(log)
    return pretrain_rank(over)
