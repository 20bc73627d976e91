"""A suite over every checkpoint a pretraining run saved: the BioMegatron paper's Table 5 (F1 against pretraining
steps). ``--model runs/x`` whose ``checkpoints/`` holds several ``iter_*`` runs the suite once per checkpoint, each an
ordinary suite folder (resume, SLURM arrays, report) under ``<out>/steps/iter_NNNNNNN/``; ``steps.json``,
``steps.md`` and ``steps.png`` (each dataset's headline score against the step) summarise them, rebuilt by
``benchmark report <out>`` as any report."""

from __future__ import annotations

import re
from pathlib import Path

from bio_megatron.benchmark.report import write_report
from bio_megatron.benchmark.suites import SUITES
from bio_megatron.utils.io import atomic_open, load_json, write_json_atomic

STEPS = "steps"
_ITER = re.compile(r"iter_(\d+)$")


def checkpoint_steps(model: Path) -> list[tuple[int, Path]]:
    """(step, checkpoint) of every ``iter_*`` a run folder (or its ``checkpoints/``) holds, by step; empty for any
    other model (one checkpoint, an HF folder, ...). ``latest`` is a link to one of them: not counted twice."""
    folder = model / "checkpoints" if (model / "checkpoints").is_dir() else model
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := _ITER.match(p.name)) and p.is_dir() and not p.is_symlink()]
    return sorted(found)


def step_folder(out: Path, step: int) -> Path:
    return out / STEPS / f"iter_{step:07d}"


def write_steps_report(out: Path, name: str | None = None) -> dict:
    """``steps.json``, ``steps.md`` and ``steps.png`` of ``out`` from the per-checkpoint suite folders (each report
    rebuilt first); a dataset without a finished cell at a step has no point there (null in the JSON)."""
    from bio_megatron.benchmark.tables import steps_plot

    rows, suite = [], None
    folders = sorted(p for p in (out / STEPS).iterdir() if _ITER.match(p.name) and (p / "manifest.json").is_file())
    for folder in folders:
        res = write_report(folder, name=name)
        suite = SUITES[res["suite"]]
        stat = suite.statistic
        scores = {r["key"]: r["stats"][r["metric"]][stat] if (r.get("stats") or {}).get(r["metric"]) else None
                  for r in res["datasets"] if r["status"] != "not selected"}
        rows.append({"step": int(_ITER.match(folder.name).group(1)), "checkpoint": res["model"],
                     "folder": str(folder.relative_to(out)), "scores": scores})
    if suite is None:
        return {"steps": []}
    titles = {d.key: (d.title, d.metric_name) for d in suite.datasets}
    keys = list(dict.fromkeys(k for r in rows for k in r["scores"]))
    summary = {"suite": suite.name, "title": suite.title, "statistic": suite.statistic, "scale": "0-100",
               "model": str(Path(load_json(folders[0] / "manifest.json")["model"]).parent.parent),
               "datasets": keys, "steps": rows, "plot": "steps.png"}
    steps_plot(summary, titles, out / "steps.png", name)
    write_json_atomic(out / "steps.json", summary)
    lines = [f"# {suite.title}: score against pretraining steps", "",
             f"Each cell: the {suite.statistic} over seeds of the dataset's headline metric (0-100) fine-tuned from "
             "the checkpoint of that step; per-step tables in steps/iter_*/results.md. Plot: steps.png.", "",
             "| Step | " + " | ".join(f"{titles[k][0]} ({titles[k][1]})" for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r['scores'][k]:.2f}" if r["scores"].get(k) is not None else "-" for k in keys]
        lines.append(f"| {r['step']:,} | " + " | ".join(cells) + " |")
    with atomic_open(out / "steps.md", "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return summary
