"""Every distillation recipe loads and validates as a DistillConfig (its student a valid pretraining config, its
loss settings in range), and bio-lm's keeps the student's pretraining settings it inherits."""

from __future__ import annotations

from pathlib import Path

import pytest

RECIPES = sorted((Path(__file__).resolve().parents[2] / "nemo_configs" / "distill").glob("[!_]*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_validates(recipe: Path) -> None:
    from bio_megatron.config.distill import DistillConfig, load_distill_config

    cfg = load_distill_config(recipe, ["model.teacher.restore_from_path=teacher"])
    assert isinstance(cfg, DistillConfig) and cfg.model.pipeline_model_parallel_size == 1
    assert cfg.model.teacher.restore_from_path == "teacher"


TASK_RECIPES = sorted((RECIPES[0].parent).glob("*/[!_]*.yaml"))  # nemo_configs/distill/<task>/: finetune recipes


def test_task_recipes_exist() -> None:
    assert [p.relative_to(RECIPES[0].parent).as_posix() for p in TASK_RECIPES] == ["ner/tiny_ner_distill.yaml"]


@pytest.mark.parametrize("recipe", TASK_RECIPES, ids=lambda p: p.stem)
def test_task_recipe_loads_as_a_finetune_config_of_its_folders_task(recipe: Path) -> None:
    from bio_megatron.config.finetune import load_finetune_config

    cfg = load_finetune_config(recipe.parent.name, recipe, ["model.teacher.restore_from_path=teacher"])
    assert cfg.model.teacher.restore_from_path == "teacher" and cfg.model.distill.temperature == 2.0
    assert load_finetune_config(recipe.parent.name, recipe).model.teacher.restore_from_path is None


def test_biolm_student_is_the_pretraining_recipe_but_for_what_distillation_changes() -> None:
    from bio_megatron.config.distill import load_distill_config
    from bio_megatron.config.loader import to_dict
    from bio_megatron.config.pretrain import load_pretrain_config

    root = RECIPES[0].parents[1]
    student = to_dict(load_pretrain_config(root / "pretrain" / "biolm_roberta_base.yaml").model)
    distill = to_dict(load_distill_config(root / "distill" / "biolm_distill_base.yaml").model)
    changed = {k for k in student if student[k] != distill[k]}
    assert changed == {"tensor_model_parallel_size", "restore_from_path", "optim"}
    assert {k for k in student["optim"] if student["optim"][k] != distill["optim"][k]} == {"lr"}


def test_pretrain_sbatch_launches_distill_or_refuses_another_command() -> None:
    """slurm/pretrain.sbatch's COMMAND picks the trainer (pretrain, distill); anything else stops before SLURM."""
    import os
    import subprocess

    repo = RECIPES[0].parents[2]
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", "slurm/pretrain.sbatch"], cwd=repo, env={**base, "COMMAND": "finetune"},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "COMMAND must be pretrain or distill, got 'finetune'" in res.stderr, res.stderr
    res = subprocess.run(["bash", "slurm/pretrain.sbatch"], cwd=repo, capture_output=True, text=True, timeout=30,
                         env={**base, "COMMAND": "distill", "RECIPE": "nemo_configs/distill/tiny_distill.yaml"})
    assert res.returncode != 0 and "not inside a SLURM job" in res.stderr, res.stderr  # past the command check
