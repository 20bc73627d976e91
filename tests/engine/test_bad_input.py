"""Bad input to ``bio-megatron pretrain`` exits non-zero, before any training, with a message naming the
thing: missing data prefix, wrong vocabulary, unknown key, impossible layout, unreadable checkpoint."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import TINY, overrides


def _cli(argv: list[str]) -> tuple[int, str]:
    from bio_megatron.cli import main
    from bio_megatron.utils.log import get_logger

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    get_logger().addHandler(handler)
    rc = main(argv)
    return rc, buf.getvalue()


def _pretrain(over: list[str]) -> tuple[int, str]:
    (res,) = run_world(1, _cli, ["pretrain", "--config", str(TINY), *over])
    return res


def test_missing_data_prefix(tmp_path, pubmed_prefix):
    missing = tmp_path / "no_such_corpus"
    rc, msg = _pretrain(overrides(missing, tmp_path, "x"))
    assert rc != 0 and str(missing) in msg and ".bin" in msg


def test_vocabulary_that_does_not_match_the_data(tmp_path, pubmed_prefix):
    vocab = tmp_path / "small_vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of"]) + "\n")
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "x", extra=(f"model.tokenizer.vocab_file={vocab}",)))
    assert rc != 0 and "outside the vocabulary (7 entries" in msg and str(pubmed_prefix) in msg


def test_vocabulary_without_special_tokens(tmp_path, pubmed_prefix):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "x", extra=(f"model.tokenizer.vocab_file={vocab}",)))
    assert rc != 0 and str(vocab) in msg and "[MASK]" in msg


def test_unknown_key_and_impossible_layout_reported_together(tmp_path, pubmed_prefix):
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "x", tp=2, extra=("model.optim.learning_rate=1",)))
    assert rc != 0
    assert "unknown key 'model.optim.learning_rate'" in msg
    assert "must divide the world size (1)" in msg


def test_unreadable_checkpoint(tmp_path, pubmed_prefix):
    broken = tmp_path / "ckpt"
    broken.mkdir()
    (broken / "bio_megatron.json").write_text('{"iteration": 2, "layout": {"tp": 1, "pp": 1}}')
    (broken / "garbage.distcp").write_bytes(b"\x00not a checkpoint")
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "x", extra=(f"exp_manager.resume_from_checkpoint={broken}",)))
    assert rc != 0 and str(broken) in msg and ".metadata is missing" in msg  # found before loading
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "y",
                                  extra=(f"exp_manager.resume_from_checkpoint={tmp_path / 'nowhere'}",)))
    assert rc != 0 and "not a BioMegatron checkpoint" in msg


def test_broken_latest_marker_is_named(tmp_path, pubmed_prefix):
    ckpts = tmp_path / "x" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "latest").write_text("7\n")  # a save that never completed
    # a run of ours (every run folder gets the marker when it starts): a folder without it is refused before this
    (tmp_path / "x" / ".bio_megatron_output.json").write_text('{"command": "pretrain"}\n')
    rc, msg = _pretrain(overrides(pubmed_prefix, tmp_path, "x"))
    assert rc != 0 and "latest" in msg and "iter_0000007" in msg


def test_console_script_exit_status(tmp_path):
    """The installed entry point itself: a config error is one clean line and exit status 2, no traceback."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "bio_megatron", "pretrain", "--config", str(TINY), "model.size=2b",
                        "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert "model.size ('2b') must be one of tiny, 345m, 800m, 1.2b" in p.stderr
    assert "Traceback" not in p.stderr
