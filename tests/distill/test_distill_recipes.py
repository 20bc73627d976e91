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
