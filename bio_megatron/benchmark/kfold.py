"""k-fold cross-validation, bio-lm's protocol for GAD and EU-ADR (paper 004 §5.2, on BioBERT's ten folds): the
hyper-parameters (a grid, early stopping's outcome) are chosen on the first fold, the chosen setting then runs on
every other fold, and the reported score is the MEDIAN over those folds' test scores (folds 2-10 of ten).

``finetune classify --config gad_folds --folds 1-10 [--grid key=v1,v2 ...] [--seeds ...]`` runs it: each fold is an
ordinary sweep (tasks/sweep.py) under ``<exp_dir>/<name>/fold<N>/`` (resumable as any sweep: finished runs are not
run again), reading its files through ``model.dataset.fold`` (tasks/folds.py); ``<name>/results.json`` and
``results.md`` hold each fold's dev and test scores (mean over the seeds) and the median, mean and spread over the
folds after the first."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from bio_megatron.config.finetune import FinetuneConfig, load_finetune_config
from bio_megatron.tasks.grid import grid_points
from bio_megatron.tasks.sweep import run_sweep, spread
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.io import atomic_open, write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def parse_folds(text: str) -> list[int]:
    """``1-10`` or ``1,2,3`` -> the folds, in order; the first is the tuning fold, at least two folds."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            folds = list(range(lo, hi + 1))
        else:
            folds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--folds {text!r}: expected a range 1-10 or a list 1,2,3") from None
    if len(folds) < 2 or len(set(folds)) != len(folds) or not all(1 <= f <= 10 for f in folds):
        raise ConfigError(f"--folds {text!r}: at least two distinct folds of 1..10 (the first tunes, the others "
                          "are reported)")
    return folds


def check_fold_key(cfg: FinetuneConfig) -> None:
    if not hasattr(cfg.model.dataset, "fold"):
        raise ConfigError(f"--folds: finetune {cfg.task} has no model.dataset.fold (classify with task_name gad or "
                          "euadr)")


def _fold_cfg(task: str, recipe, overrides: list[str], fold: int, name: str, world_size: int | None):
    cfg = load_finetune_config(task, recipe, [*overrides, f"model.dataset.fold={fold}"], world_size)
    cfg.exp_manager.name = f"{name}/fold{fold}"
    return cfg


def _chosen_overrides(cfg: FinetuneConfig, summary: dict) -> list[str]:
    """The tuning fold's selected grid point as overrides for the other folds."""
    sel = summary["selected"]
    if summary.get("grid_keys"):
        return [f"{k}={sel[k]}" for k in summary["grid_keys"]]
    if summary.get("grid"):
        layers = ("model.classifier_head.num_output_layers" if cfg.task in ("re", "classify")
                  else "model.head.num_fc_layers")
        return [f"{layers}={sel['num_fc_layers']}", f"model.fc_hidden_size={sel['fc_hidden_size']}"]
    return []


def cross_validate(task: str, recipe, overrides: list[str], folds: list[int], seeds: list[int] | None,
                   head_grid: bool, specs: list[str], world_size: int | None) -> dict:
    """Tune on ``folds[0]`` (the grid, if any), run the chosen setting on the rest, summarise (see the module)."""
    base = load_finetune_config(task, recipe, overrides, world_size)
    check_fold_key(base)
    name, tune = base.exp_manager.name, folds[0]
    cfg = _fold_cfg(task, recipe, overrides, tune, name, world_size)
    points = None
    if specs:
        points = grid_points(task, recipe, [*overrides, f"model.dataset.fold={tune}"], specs, world_size)
        for p in points:
            p.cfg.exp_manager.name = cfg.exp_manager.name
    log.info("cross-validation: tuning on fold %d, then folds %s", tune, ", ".join(map(str, folds[1:])))
    tuned = run_sweep(cfg, seeds, head_grid, points)
    if tuned.get("status") == "interrupted":
        return {**tuned, "interrupted_fold": tune}
    chosen = _chosen_overrides(cfg, tuned)
    per_fold = {tune: tuned}
    for fold in folds[1:]:
        summary = run_sweep(_fold_cfg(task, recipe, [*overrides, *chosen], fold, name, world_size), seeds)
        if summary.get("status") == "interrupted":
            return {**summary, "interrupted_fold": fold}
        per_fold[fold] = summary
    metric = tuned["metric"]
    rows = [{"fold": f, "dev": s["dev"][metric]["mean"], "test": s["test"][metric]["mean"] if "test" in s else None,
             "seeds": len(s["seeds"]), "tuning": f == tune} for f, s in per_fold.items()]
    reported = [r["test"] for r in rows if not r["tuning"] and r["test"] is not None]
    result = {"benchmark": base.name, "task": task, "status": "finished", "protocol": "k-fold", "metric": metric,
              "tuned_on": tune, "selected": tuned["selected"], "chosen_overrides": chosen, "folds": rows,
              "test": spread(reported) if reported else None}
    if not dist.is_initialized() or dist.get_rank() == 0:
        out = Path(base.exp_manager.exp_dir) / name
        write_json_atomic(out / "results.json", result)
        with atomic_open(out / "results.md", "w", encoding="utf-8") as fh:
            fh.write(markdown(result))
    return result


def markdown(result: dict) -> str:
    m = result["metric"]
    lines = [f"## {result['benchmark']} ({result['task']}): cross-validation, tuned on fold {result['tuned_on']}"
             + (f" ({', '.join(result['chosen_overrides'])})" if result["chosen_overrides"] else ""), "",
             f"| fold | dev {m} | test {m} | seeds | |", "|---|---|---|---|---|"]
    for r in result["folds"]:
        test = f"{r['test']:.4g}" if r["test"] is not None else "-"
        lines.append(f"| {r['fold']} | {r['dev']:.4g} | {test} | {r['seeds']} | {'tuning' if r['tuning'] else ''} |")
    t = result["test"]
    if t:
        lines += ["", f"Test {m} over folds {', '.join(str(r['fold']) for r in result['folds'] if not r['tuning'])}: "
                      f"**median {t['median']:.4g}**, mean {t['mean']:.4g} ± {t['std']:.2g} (n={t['n']})"]
    return "\n".join(lines) + "\n"

