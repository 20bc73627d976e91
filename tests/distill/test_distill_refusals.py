"""Bad input to ``bio-megatron distill`` through the CLI: a teacher with another vocabulary, a student wider than
the projection allows, a teacher checkpoint that does not load (damaged, or no checkpoint at all), pipeline
parallelism: one line, exit 2, nothing written (the run folder is never created; the teacher is unchanged)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from distill_runs import distill_overrides
from harness import cli_forked, run_world
from reliability.files import tree_digest


def _cli(argv: list[str]) -> tuple[int, str]:
    from reliability.cli_log import run_cli

    return run_cli(argv)


def _damaged(teacher: Path, tmp: Path) -> Path:
    """A copy of the teacher with one weight shard's bytes flipped (its checksums no longer match)."""
    copy = tmp / "damaged_teacher"
    shutil.copytree(teacher, copy)
    shard = sorted((copy / "checkpoints").glob("iter_*/*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return copy


CASES = {
    "other_vocabulary": (("model.tokenizer.vocab_file=bert_base_cased",), "not the student's"),
    "student_wider": (("model.hidden_size=128", "model.num_attention_heads=4", "model.ffn_hidden_size=512"),
                      "wider than"),
    "damaged_teacher": ((), "damaged_teacher/checkpoints/iter_0000004 is damaged"),
    "no_teacher_there": ((), "model.teacher.restore_from_path: "),
    "pipeline": (("model.pipeline_model_parallel_size=2",), "must be 1 for distillation"),
    "other_vocabulary_dry_run": (("model.tokenizer.vocab_file=bert_base_cased",), "not the student's"),
    "student_wider_dry_run": (("model.hidden_size=128", "model.num_attention_heads=4", "model.ffn_hidden_size=512"),
                              "wider than"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_nothing_written(case: str, pubmed_prefix, distill_teacher,
                                                          tmp_path) -> None:
    extra, expected = CASES[case]
    teacher = {"damaged_teacher": lambda: _damaged(distill_teacher, tmp_path),
               "no_teacher_there": lambda: tmp_path / "no_teacher_here"}.get(case, lambda: distill_teacher)()
    before = tree_digest(distill_teacher)
    over = distill_overrides(pubmed_prefix, tmp_path / "runs", "student", teacher, extra=extra)
    from distill_runs import TINY_DISTILL

    # refused at config time, before any world exists; the dry run checks the teacher as the run does
    dry = ["--dry-run"] if case == "pipeline" or case.endswith("dry_run") else []
    (rc, msg), = run_world(1, _cli, ["distill", "--config", str(TINY_DISTILL), *dry, *over])
    assert rc == 2, msg
    assert expected in msg and "Traceback" not in msg
    assert len(msg.splitlines()) <= 2, msg  # ConfigError: its header line and the one problem
    assert not (tmp_path / "runs" / "student").exists()
    assert tree_digest(distill_teacher) == before


def test_dry_run_shows_the_teacher_as_the_run_builds_it(pubmed_prefix, distill_teacher, tmp_path) -> None:
    import json

    from distill_runs import TINY_DISTILL

    over = distill_overrides(pubmed_prefix, tmp_path, "student", distill_teacher)
    res = cli_forked(["distill", "--config", str(TINY_DISTILL), "--dry-run", *over], timeout=120)
    assert res.returncode == 0, res.stderr
    teacher = json.loads(res.stdout)["teacher"]
    assert teacher == {"path": teacher["path"], "kind": "checkpoint", "family": "megatron_bert", "num_layers": 4,
                       "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256, "precision": 32,
                       "projection": True}
    assert Path(teacher["path"]).parent.parent == distill_teacher
    assert not (tmp_path / "student").exists()
