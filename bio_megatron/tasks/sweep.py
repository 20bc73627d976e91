"""Several seeds (mean / median / spread, the bio-lm and BioM protocol) and a grid selected on dev: the recipe's
head grid (``num_fc_layers`` x ``fc_hidden_size``) or any keys (``--grid key=v1,v2``, tasks/grid.py), with results as JSON and a Markdown
table."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import torch.distributed as dist

from bio_megatron.config.finetune import FinetuneConfig
from bio_megatron.tasks.finetune import run_finetuning
from bio_megatron.tasks.grid import GridPoint
from bio_megatron.utils.io import atomic_open, write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
REPORTED = {"ner": ("precision", "recall", "f1"), "re": ("precision", "recall", "f1"),
            "squad": ("exact", "exact_match", "f1"), "bioasq": ("strict_accuracy", "lenient_accuracy", "mrr"),
            # BLURB classify: the headline first; then whichever of the others the dataset's metric reports
            "classify": ("score", "accuracy", "precision", "recall", "f1", "pearson")}


def _metrics(cfg: FinetuneConfig) -> tuple[str, ...]:
    if cfg.task == "qa":
        return REPORTED["bioasq" if cfg.model.dataset.bioasq_golden else "squad"]
    return REPORTED[cfg.task]


def spread(values: list[float]) -> dict:
    """mean, median, sample standard deviation, min, max, n."""
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values),
            "n": len(values)}


def _set_layers(cfg: FinetuneConfig, n: int) -> None:
    if cfg.task in ("re", "classify"):
        cfg.model.classifier_head.num_output_layers = n
    else:
        cfg.model.head.num_fc_layers = n


def _head_points(cfg: FinetuneConfig, grid: bool) -> list[tuple[dict, FinetuneConfig]]:
    """The recipe's head grid (bare ``--grid``: ``grid.num_fc_layers`` x ``grid.fc_hidden_size``), or no grid."""
    if not grid:
        return [({"num_fc_layers": None, "fc_hidden_size": None}, cfg)]
    points = []
    for n in cfg.grid.num_fc_layers:
        for w in cfg.grid.fc_hidden_size:
            variant = copy.deepcopy(cfg)
            _set_layers(variant, n)
            variant.model.fc_hidden_size = w
            points.append(({"num_fc_layers": n, "fc_hidden_size": w}, variant))
    return points


def run_sweep(cfg: FinetuneConfig, seeds: list[int] | None = None, grid: bool = False,
              points: list[GridPoint] | None = None) -> dict:
    """Run every (grid point x seed); pick the grid point with the best mean dev metric; summarise its seeds.
    ``grid``: the recipe's head grid; ``points``: a grid over any keys (``--grid key=v1,v2``, tasks/grid.py)."""
    seeds = seeds or [cfg.trainer.seed]
    if points:
        todo = [(p.values, p.cfg, p.tag + "/") for p in points]
    else:
        todo = [(v, c, f"layers{v['num_fc_layers']}_width{v['fc_hidden_size']}/" if grid else "")
                for v, c in _head_points(cfg, grid)]
    runs = []
    for values, point_cfg, prefix in todo:
        for seed in seeds:
            variant = copy.deepcopy(point_cfg)
            variant.trainer.seed = seed
            tag = f"{prefix}seed{seed}"
            variant.exp_manager.name = f"{cfg.exp_manager.name}/{tag}"
            done = variant.run_dir / "results.json"
            if variant.exp_manager.resume_if_exists and done.is_file() and \
                    json.loads(done.read_text()).get("status") == "finished":
                log.info("sweep run %s already finished (%s): not run again", tag, done)
                res = json.loads(done.read_text())
            else:
                log.info("sweep run %s", tag)
                res = run_finetuning(variant)
            if res.get("status") == "interrupted":
                return {"benchmark": cfg.name, "task": cfg.task, "status": "interrupted", "interrupted_run": tag}
            runs.append({**values, "seed": seed, "dev": res["dev"], "test": res.get("test"),
                         "checkpoint": res["checkpoint"], **_stopped(res)})
    keys = list(todo[0][0])
    # what run_finetuning selects on (classify: the dataset's BLURB metric, as "score")
    metric = "mrr" if cfg.task == "qa" and cfg.model.dataset.bioasq_golden else "score" if cfg.task == "classify" \
        else "f1"
    by_point = {}
    for r in runs:
        by_point.setdefault(tuple(r[k] for k in keys), []).append(r)
    grid_rows = [{**dict(zip(keys, p)), "dev_" + metric: statistics.fmean(r["dev"][metric] for r in rs)}
                 for p, rs in by_point.items()]
    best = max(grid_rows, key=lambda row: row["dev_" + metric])  # the first of equals: the grid's order
    chosen = by_point[tuple(best[k] for k in keys)]
    summary = {"benchmark": cfg.name, "task": cfg.task, "status": "finished", "metric": metric, "seeds": seeds,
               "selected": best, "grid": grid_rows if grid or points else None, "grid_keys": keys if points else None,
               "runs": runs,
               "dev": {k: spread([r["dev"][k] for r in chosen]) for k in _metrics(cfg) if k in chosen[0]["dev"]}}
    if all(r["test"] for r in chosen):
        summary["test"] = {k: spread([r["test"][k] for r in chosen]) for k in _metrics(cfg) if k in chosen[0]["test"]}
    if not dist.is_initialized() or dist.get_rank() == 0:
        out = Path(cfg.exp_manager.exp_dir) / cfg.exp_manager.name
        write_json_atomic(out / "results.json", summary)
        with atomic_open(out / "results.md", "w", encoding="utf-8") as fh:
            fh.write(markdown(summary))
    return summary


def _stopped(res: dict) -> dict:
    """Early stopping's record of a run (tasks/finetune.py), when it stopped early."""
    return {"stopped_early_at": res["stopped_early_at"]} if res.get("stopped_early_at") else {}


def markdown(summary: dict) -> str:
    """The paper's layout: one row per benchmark and split, the metric columns, mean (s.d.) and median over seeds."""
    lines = [f"## {summary['benchmark']} ({summary['task']}), {len(summary['seeds'])} seed(s): "
             f"{', '.join(map(str, summary['seeds']))}", ""]
    for split in ("dev", "test"):
        if split not in summary:
            continue
        keys = list(summary[split])
        lines += [f"| Benchmark | split | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
        cells = [f"{v['mean']:.4g} ± {v['std']:.2g} (median {v['median']:.4g})" for v in summary[split].values()]
        lines += [f"| {summary['benchmark']} | {split} | " + " | ".join(cells) + " |", ""]
    if summary.get("grid"):
        m = "dev_" + summary["metric"]
        keys = summary.get("grid_keys") or ["num_fc_layers", "fc_hidden_size"]
        lines += ["| " + " | ".join(keys) + f" | {m} (mean over seeds) | selected |",
                  "|" + "---|" * (len(keys) + 2)]
        for row in summary["grid"]:
            sel = "✓" if row == summary["selected"] else ""
            lines.append("| " + " | ".join(str(row[k]) for k in keys) + f" | {row[m]:.4g} | {sel} |")
        lines.append("")
    return "\n".join(lines) + "\n"
