"""``finetune <task> --grid key=v1,v2 [--grid key2=...]``: a grid over any config key (learning rate, batch size,
epochs, layer-wise decay, head shape), the cartesian product of the flags, each point a fully validated config.
The protocols it serves: BioELECTRA's and BioM-Transformers' grids over learning rate, batch size and epochs,
selected on dev (papers 002 and 000); the sweep (tasks/sweep.py) runs every point x seed and picks on dev."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from bio_megatron.config.finetune import FinetuneConfig, load_finetune_config
from bio_megatron.utils.errors import ConfigError


@dataclass
class GridPoint:
    values: dict[str, str]
    """key -> the value as given on the command line (the summary's columns)."""
    cfg: FinetuneConfig

    @property
    def tag(self) -> str:
        """The point's folder under the sweep: ``model.optim.lr=2e-05+trainer.max_epochs=3``."""
        return "+".join(f"{k}={v}".replace("/", "_") for k, v in self.values.items())


def split_values(text: str) -> list[str]:
    """``1e-5,2e-5`` -> two values; commas inside ``[...]`` stay (a list value: ``[1,2],[3]``)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def parse_grid(specs: list[str]) -> dict[str, list[str]]:
    """``["model.optim.lr=1e-5,2e-5", "trainer.max_epochs=3,5"]`` -> {key: [values]}; one line per bad flag."""
    grid: dict[str, list[str]] = {}
    problems = []
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        values = [v.strip() for v in split_values(text)] if sep else []
        if not key or not sep or not all(values):
            problems.append(f"--grid {spec!r}: expected key=v1,v2,... (e.g. model.optim.lr=1e-5,2e-5)")
        elif key in grid:
            problems.append(f"--grid {key}: given twice (one flag per key; its values are comma-separated)")
        elif len(set(values)) != len(values):
            problems.append(f"--grid {spec!r}: a value is given twice (each value is one run folder)")
        else:
            grid[key] = values
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else problems)
    return grid


def grid_points(task: str, recipe: str | Path | None, overrides: list[str], specs: list[str],
                world_size: int | None) -> list[GridPoint]:
    """Every point of the cartesian product as a config built from the recipe, the overrides and the point's
    values (a grid value overrides a command-line override of the same key). Each key is checked alone first, so
    an unknown key or a bad value is one line naming the ``--grid`` flag, before anything runs."""
    grid = parse_grid(specs)
    problems = []
    for key, values in grid.items():
        for v in values:
            try:
                load_finetune_config(task, recipe, [*overrides, f"{key}={v}"], world_size)
            except ConfigError as e:
                reason = str(e).splitlines()[-1].strip().removeprefix("- ")
                problems.append(f"--grid {key}={','.join(values)}: {reason}")
                break
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else problems)
    points = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo))
        cfg = load_finetune_config(task, recipe, [*overrides, *(f"{k}={v}" for k, v in values.items())], world_size)
        points.append(GridPoint(values, cfg))
    return points
