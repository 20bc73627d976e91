"""Several seeds (mean / median / spread, the bio-lm and BioM protocol) and the small head grid
(``num_fc_layers`` x ``fc_hidden_size``, selected on dev), with results as JSON and a Markdown table."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import torch.distributed as dist

from bio_megatron.config.finetune import FinetuneConfig
from bio_megatron.tasks.finetune import run_finetuning
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


def run_sweep(cfg: FinetuneConfig, seeds: list[int] | None = None, grid: bool = False) -> dict:
    """Run every (grid point x seed); pick the grid point with the best mean dev metric; summarise its seeds."""
    seeds = seeds or [cfg.trainer.seed]
    points = [(n, w) for n in cfg.grid.num_fc_layers for w in cfg.grid.fc_hidden_size] if grid else [(None, None)]
    runs = []
    for n, w in points:
        for seed in seeds:
            variant = copy.deepcopy(cfg)
            variant.trainer.seed = seed
            tag = (f"layers{n}_width{w}/" if n is not None else "") + f"seed{seed}"
            variant.exp_manager.name = f"{cfg.exp_manager.name}/{tag}"
            if n is not None:
                _set_layers(variant, n)
                variant.model.fc_hidden_size = w
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
            runs.append({"num_fc_layers": n, "fc_hidden_size": w, "seed": seed, "dev": res["dev"],
                         "test": res.get("test"), "checkpoint": res["checkpoint"]})
    # what run_finetuning selects on (classify: the dataset's BLURB metric, as "score")
    metric = "mrr" if cfg.task == "qa" and cfg.model.dataset.bioasq_golden else "score" if cfg.task == "classify" \
        else "f1"
    by_point = {}
    for r in runs:
        by_point.setdefault((r["num_fc_layers"], r["fc_hidden_size"]), []).append(r)
    grid_rows = [{"num_fc_layers": p[0], "fc_hidden_size": p[1],
                  "dev_" + metric: statistics.fmean(r["dev"][metric] for r in rs)} for p, rs in by_point.items()]
    best = max(grid_rows, key=lambda row: row["dev_" + metric])
    chosen = by_point[(best["num_fc_layers"], best["fc_hidden_size"])]
    summary = {"benchmark": cfg.name, "task": cfg.task, "status": "finished", "metric": metric, "seeds": seeds, "selected": best,
               "grid": grid_rows if grid else None, "runs": runs,
               "dev": {k: spread([r["dev"][k] for r in chosen]) for k in _metrics(cfg) if k in chosen[0]["dev"]}}
    if all(r["test"] for r in chosen):
        summary["test"] = {k: spread([r["test"][k] for r in chosen]) for k in _metrics(cfg) if k in chosen[0]["test"]}
    if not dist.is_initialized() or dist.get_rank() == 0:
        out = Path(cfg.exp_manager.exp_dir) / cfg.exp_manager.name
        write_json_atomic(out / "results.json", summary)
        with atomic_open(out / "results.md", "w", encoding="utf-8") as fh:
            fh.write(markdown(summary))
    return summary


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
        lines += ["| num_fc_layers | fc_hidden_size | " + m + " (mean over seeds) | selected |", "|---|---|---|---|"]
        for row in summary["grid"]:
            sel = "✓" if row == summary["selected"] else ""
            lines.append(f"| {row['num_fc_layers']} | {row['fc_hidden_size']} | {row[m]:.4g} | {sel} |")
        lines.append("")
    return "\n".join(lines) + "\n"
