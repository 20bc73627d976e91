"""Run folders (issue 21, item 1): a run stays inside ``exp_manager.exp_dir`` and never writes into a folder that
is not a run of ours; our own runs, old and new, still resume.

Found on main before issue 21: ``exp_manager.name=../x`` put the run beside ``exp_dir``; a pretraining or
fine-tuning run into a folder of the user's files wrote its metrics, checkpoints and lock among them (and
fine-tuning deletes a ``checkpoints/`` folder there). Real runs of the CLI in forked gloo worlds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness import run_world
from engine.pretrain_runs import TINY, overrides
from finetune.ft_runs import RECIPES
from reliability.cli_log import run_cli
from reliability.files import tree_digest
from reliability.test_nonfinite import cli_rank

MARKER = ".bio_megatron_output.json"


def _pretrain(prefix: Path, root: Path, name: str, steps: int = 2, world: int = 1) -> list[tuple[int, str]]:
    return run_world(world, cli_rank, ["pretrain", "--config", str(TINY),
                                       *overrides(prefix, root, name, steps=steps, save_last=True)])


@pytest.mark.parametrize("name", ["../escaped", "/tmp/absolute", "..", "x/../../y", "./x"])
def test_run_name_cannot_leave_exp_dir(tmp_path, name):
    exp = tmp_path / "runs"
    rc, msg = run_cli(["pretrain", "--config", str(TINY), f"exp_manager.exp_dir={exp}", f"exp_manager.name={name}",
                       "--dry-run"])
    assert rc == 2 and f"exp_manager.name ({name!r}) must stay inside exp_manager.exp_dir" in msg, msg
    rc, msg = run_cli(["finetune", "ner", "--config", str(RECIPES["ner"]), f"exp_manager.exp_dir={exp}",
                       f"exp_manager.name={name}", "--dry-run"])
    assert rc == 2 and f"exp_manager.name ({name!r})" in msg, msg
    assert list(tmp_path.iterdir()) == []


def test_absolute_exp_dir_is_meant_but_not_a_system_folder(tmp_path):
    rc, msg = run_cli(["pretrain", "--config", str(TINY), f"exp_manager.exp_dir={tmp_path / 'abs'}",
                       "exp_manager.name=x", "--dry-run", "--skip-path-checks"])  # (the recipe names no corpus)
    assert rc == 0, msg
    rc, msg = run_cli(["pretrain", "--config", str(TINY), "exp_manager.exp_dir=/etc", "exp_manager.name=x",
                       "--dry-run"])
    assert rc == 2 and "exp_manager.exp_dir (/etc) places the run in a system folder (/etc)" in msg, msg


def test_pretraining_refuses_a_folder_of_user_files(pubmed_prefix, tmp_path):
    mine = tmp_path / "thesis"
    (mine / "figures").mkdir(parents=True)
    (mine / "chapter1.tex").write_text("\\chapter{Intro}\n")
    (mine / "figures" / "f1.png").write_bytes(b"\x89PNG fake")
    before = tree_digest(mine)
    [(rc, msg)] = _pretrain(pubmed_prefix, tmp_path, "thesis")
    assert rc == 2 and f"{mine}: the run folder" in msg and "is not a pretrain run of ours" in msg, msg
    assert "chapter1.tex" in msg
    assert tree_digest(mine) == before and sorted(p.name for p in mine.iterdir()) == ["chapter1.tex", "figures"]


def test_pretraining_refuses_another_commands_output(pubmed_prefix, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"command": "export hf", "version": "1", "files": ["config.json"]}))
    (out / "config.json").write_text("{}\n")
    before = tree_digest(out)
    [(rc, msg)] = _pretrain(pubmed_prefix, tmp_path, "hf")
    assert rc == 2 and "holds a `export hf` output, not a pretrain run" in msg, msg
    assert tree_digest(out) == before


def test_finetuning_refuses_a_folder_of_user_files(tmp_path):
    run = tmp_path / "ft" / "seed42"  # the recipe's seed: the folder this run would write
    (run / "checkpoints").mkdir(parents=True)  # fine-tuning deletes a checkpoints/ it finds in a new run
    (run / "checkpoints" / "mine.pt").write_bytes(b"the user's own weights")
    (run / "notes.txt").write_text("keep\n")
    before = tree_digest(run)
    [(rc, msg)] = run_world(1, cli_rank, ["finetune", "ner", "--config", str(RECIPES["ner"]),
                                          f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ft",
                                          "trainer.max_steps=2", "model.dataset.max_train_examples=16",
                                          "model.dataset.max_eval_examples=8", "model.dataset.test_file=null"])
    assert rc == 2 and f"{run}: the run folder" in msg and "is not a finetune run of ours" in msg, msg
    assert tree_digest(run) == before


def test_symlinked_run_lock_leaves_its_target_alone(pubmed_prefix, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.lock").symlink_to(victim)
    [(rc, msg)] = _pretrain(pubmed_prefix, tmp_path, "r")
    assert rc == 2 and "run.lock" in msg and "symbolic link" in msg, msg
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == digest and (run / "run.lock").is_symlink()


def test_our_runs_resume_with_and_without_a_marker(pubmed_prefix, tmp_path):
    run = tmp_path / "r"
    assert _pretrain(pubmed_prefix, tmp_path, "r", steps=2) == [(0, "")]
    assert json.loads((run / MARKER).read_text())["command"] == "pretrain"
    (run / "notes.txt").write_text("a user's file in a run of ours is kept\n")
    assert _pretrain(pubmed_prefix, tmp_path, "r", steps=3) == [(0, "")]
    assert json.loads((run / "status.json").read_text()) == {"state": "finished", "step": 3}
    (run / MARKER).unlink()  # a run folder from before the marker: recognised by what a run writes
    assert _pretrain(pubmed_prefix, tmp_path, "r", steps=4) == [(0, "")]
    assert json.loads((run / "status.json").read_text()) == {"state": "finished", "step": 4}
    assert (run / MARKER).is_file() and (run / "notes.txt").is_file()


def test_finetuning_refuses_a_user_folder_as_its_sweep_folder(tmp_path):
    """``exp_dir/name`` gets the sweep's results.json and results.md: a folder of the user's is not used."""
    sweep = tmp_path / "ner"
    sweep.mkdir()
    (sweep / "results.md").write_text("# my own results\n")
    (sweep / "paper.pdf").write_bytes(b"%PDF fake")
    before = tree_digest(sweep)
    rc, msg = run_cli(["finetune", "ner", "--config", str(RECIPES["ner"]), f"exp_manager.exp_dir={tmp_path}",
                       "exp_manager.name=ner", "trainer.max_steps=2"])
    assert rc == 2 and f"{sweep}: the experiment folder" in msg and "paper.pdf" in msg, msg
    assert tree_digest(sweep) == before


def test_demo_does_not_delete_files_added_to_its_earlier_run(tmp_path):
    """The demo replaces its earlier run, but only when that folder holds nothing a run does not write: a user's
    notes beside the metrics were deleted with the run (rmtree after a check for metrics.jsonl alone)."""
    run_dir = tmp_path / "demo" / "tiny_tp2"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    (run_dir / "notes.txt").write_text("what I saw in this run\n")
    rc, msg = run_cli(["demo", "--out", str(tmp_path / "demo")])
    assert rc == 2 and "notes.txt" in msg and str(run_dir) in msg
    assert (run_dir / "notes.txt").read_text() == "what I saw in this run\n"


def test_slurm_launch_markers_are_ours(tmp_path):
    """slurm/common.sh touches `.launch-<job>-<restart>` in the run folder before the trainer starts: a folder holding
    only that is a new run (pretraining and a fine-tuning sweep), while a user's file beside it is still refused."""
    from bio_megatron.training.guards import check_run_dir, check_sweep_dir
    from bio_megatron.utils.errors import OutputError

    run = tmp_path / "run"
    run.mkdir()
    (run / ".launch-9-0").touch()
    check_run_dir(run, "pretrain")
    check_run_dir(run, "finetune")
    check_sweep_dir(run)
    (run / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError, match="notes.txt"):
        check_run_dir(run, "pretrain")
    with pytest.raises(OutputError, match="notes.txt"):
        check_sweep_dir(run)
