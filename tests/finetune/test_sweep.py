"""``--seeds`` and ``--grid``: every grid point x seed runs, the point with the best mean dev metric is
selected, and its seeds are summarised (mean/median/s.d.) in JSON and in the Markdown table."""

from __future__ import annotations

import json
import statistics

from ft_runs import RECIPES, ROOT
from harness import run_world


def _sweep(exp_dir: str) -> dict:
    import os

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.sweep import run_sweep

    os.chdir(ROOT)
    cfg = load_finetune_config("ner", RECIPES["ner"], [
        f"exp_manager.exp_dir={exp_dir}", "trainer.max_steps=2", "trainer.val_check_interval=2",
        "model.dataset.max_eval_examples=40", "grid.num_fc_layers=[1,2]", "grid.fc_hidden_size=[16,32]"], 1)
    return run_sweep(cfg, seeds=[3, 4], grid=True)


def test_grid_and_seeds(tmp_path):
    (summary,) = run_world(1, _sweep, str(tmp_path))
    assert len(summary["runs"]) == 8
    points = {(r["num_fc_layers"], r["fc_hidden_size"]) for r in summary["runs"]}
    assert points == {(1, 16), (1, 32), (2, 16), (2, 32)}
    means = {(g["num_fc_layers"], g["fc_hidden_size"]): g["dev_f1"] for g in summary["grid"]}
    sel = summary["selected"]
    assert means[(sel["num_fc_layers"], sel["fc_hidden_size"])] == max(means.values())
    chosen = [r["test"]["f1"] for r in summary["runs"]
              if (r["num_fc_layers"], r["fc_hidden_size"]) == (sel["num_fc_layers"], sel["fc_hidden_size"])]
    assert summary["test"]["f1"]["median"] == statistics.median(chosen)
    assert summary["test"]["f1"]["mean"] == statistics.fmean(chosen)
    md = (tmp_path / "tiny_ner" / "results.md").read_text()
    assert "| num_fc_layers | fc_hidden_size |" in md and "✓" in md
    assert json.loads((tmp_path / "tiny_ner" / "results.json").read_text())["selected"] == sel
