"""Values that parse but cannot work (issue 11, items 6 and 7, and the first-hour list): negative or zero sizes,
NaN/Inf or non-positive learning rates, out-of-range dropout, empty fine-tuning splits, and a sequence length
the restored checkpoint cannot hold. Each is one clear message and exit 2, with nothing written.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from reliability.files import tree_digest
from harness import run_world
from engine.pretrain_runs import TINY, overrides, pretrain_rank
from finetune.ft_runs import RECIPES, ROOT

NER_DATA = ROOT / "tests" / "fixtures" / "finetune"


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """The real CLI in this process: exit code, the error it logged, what it printed on stdout."""
    capsys.readouterr()
    rc, messages = run_cli(argv, logging.ERROR, "\n")
    return rc, messages, capsys.readouterr().out


def test_pretrain_dry_run_lists_every_bad_value(capsys):
    bad = ["model.num_layers=-2", "model.hidden_size=0", "model.optim.lr=nan", "model.hidden_dropout=-0.1",
           "model.attention_dropout=1.5", "model.optim.weight_decay=-1", "model.micro_batch_size=0",
           "trainer.max_steps=0", "model.optim.betas=[0.9,1.5]", "trainer.gradient_clip_val=inf",
           "trainer.max_nonfinite_steps=0", "model.optim.eps=0"]
    rc, err, out = _run(["pretrain", "--config", str(TINY), "--dry-run", *bad], capsys)
    assert rc == 2 and out == ""  # no resolved config, no (negative) parameter count
    for expected in ("model.num_layers (-2) must be >= 1", "model.hidden_size (0) must be >= 1",
                     "model.optim.lr (nan) must be a finite number > 0", "model.hidden_dropout (-0.1) must be in [0, 1)",
                     "model.attention_dropout (1.5) must be in [0, 1)",
                     "model.optim.weight_decay (-1.0) must be a finite number >= 0",
                     "model.micro_batch_size (0) must be >= 1", "trainer.max_steps (0) must be >= 1",
                     "model.optim.betas[1] (1.5) must be in [0, 1)", "trainer.gradient_clip_val (inf)",
                     "trainer.max_nonfinite_steps (0) must be >= 1", "model.optim.eps (0.0) must be a finite number > 0"):
        assert expected in err, expected
    assert err.count("\n  - ") == len(bad)  # all at once, one line each


@pytest.mark.parametrize("value, expected", [("-1e-3", "(-0.001) must be a finite number > 0"),
                                             ("0", "(0.0) must be a finite number > 0"),
                                             ("inf", "(inf) must be a finite number > 0")])
def test_pretrain_rejects_unusable_learning_rates(capsys, value, expected):
    rc, err, out = _run(["pretrain", "--config", str(TINY), "--dry-run", f"model.optim.lr={value}"], capsys)
    assert rc == 2 and out == "" and f"model.optim.lr {expected}" in err


def test_min_lr_above_lr_is_named(capsys):
    rc, err, _ = _run(["pretrain", "--config", str(TINY), "--dry-run", "model.optim.lr=1e-5"], capsys)
    assert rc == 2 and "model.optim.sched.min_lr (0.0001) must not exceed model.optim.lr (1e-05)" in err


def test_good_recipe_still_dry_runs(capsys):
    rc, err, out = _run(["pretrain", "--config", str(TINY), "--dry-run", "--skip-path-checks"], capsys)  # no corpus
    assert rc == 0 and err == "" and '"parameters"' in out


def test_finetune_dry_run_rejects_bad_values(capsys):
    rc, err, out = _run(["finetune", "ner", "--config", str(RECIPES["ner"]), "--dry-run", "model.optim.lr=nan",
                         "trainer.val_check_interval=-1", "model.dataset.max_train_examples=0",
                         "model.head.fc_dropout=nan"], capsys)
    assert rc == 2 and out == ""
    for expected in ("model.optim.lr (nan)", "trainer.val_check_interval (-1) must be >= 0",
                     "model.dataset.max_train_examples (0) must be >= 1", "head fc_dropout (nan)"):
        assert expected in err, expected


@pytest.mark.parametrize("split", ["dev", "train"])
def test_empty_finetuning_split_is_an_error_naming_the_file(tmp_path, capsys, split):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_bytes((NER_DATA / "bc5cdr_chem_train_head.tsv").read_bytes())
    (data / "dev.tsv").write_bytes((NER_DATA / "bc5cdr_chem_devel_head.tsv").read_bytes())
    (data / f"{split}.tsv").write_text("\n\n" if split == "dev" else "")  # blank lines only / empty
    before = tree_digest(data)
    rc, err, out = _run(["finetune", "ner", "--config", str(RECIPES["ner"]), f"model.dataset.data_dir={data}",
                         "model.dataset.train_file=train.tsv", "model.dataset.dev_file=dev.tsv",
                         "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path / 'runs'}"], capsys)
    assert rc == 2 and out == ""
    assert f"{data / f'{split}.tsv'}: no usable {split} examples" in err
    assert not (tmp_path / "runs").exists()  # no run directory, no results.json, no "best" model
    assert tree_digest(data) == before


def test_sequence_length_beyond_the_restored_checkpoint_names_it(pubmed_prefix, tmp_path, capsys):
    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "src", steps=1, save_last=True))
    ckpts = tmp_path / "src" / "checkpoints"
    before = tree_digest(ckpts)
    rc, err, out = _run(["finetune", "ner", "--config", str(RECIPES["ner"]), f"model.restore_from_path={ckpts}",
                         f"model.dataset.data_dir={NER_DATA}", f"exp_manager.exp_dir={tmp_path / 'runs'}"], capsys)
    assert rc == 2 and out == ""
    assert "model.dataset.max_seq_length (128) exceeds max_position_embeddings (64) of the checkpoint" in err
    assert str(ckpts) in err and "model.dataset.max_seq_length=64" in err
    assert tree_digest(ckpts) == before and not (tmp_path / "runs").exists()
