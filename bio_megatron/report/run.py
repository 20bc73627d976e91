"""A run folder's curves: loss, learning rate, gradient norm, validation loss / dev metric per evaluation and
throughput, as matplotlib PNGs (Agg backend) beside one self-contained ``index.html`` (no network: the page
references the PNGs next to it).

What runs write today, read as it is:

- pretraining: ``metrics.jsonl``, one object per logged step (``step``, ``loss``, ``lr``, ``grad_norm``,
  ``tokens_per_sec``, ...) and ``{"step", "val_loss"}`` per evaluation; a resumed run's later record for a step wins.
- fine-tuning: ``metrics.jsonl`` where the run writes one, else the ``history`` of ``results.json`` (a finished
  run) or of ``resume/state.json`` (an interrupted one): ``{"step", "loss", "lr"}`` per step and
  ``{"step", "dev_<metric>"}`` per evaluation. That history has no gradient norm or throughput: the page says
  which curves the run did not record rather than drawing empty axes.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_path, iter_json_lines, load_json
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
COMMAND = "report"
THROUGHPUT_KEYS = ("tokens_per_sec", "examples_per_sec", "samples_per_sec")


@dataclass
class RunMetrics:
    """Per-step training records and per-evaluation records of one run, in step order."""

    source: Path
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)

    def series(self, key: str, evals: bool = False) -> tuple[list[int], list[float]]:
        """(steps, values) of ``key`` where it is a finite number."""
        rows = self.evals if evals else self.train
        pts = [(r["step"], float(r[key])) for r in rows
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
        return [s for s, _ in pts], [v for _, v in pts]

    def eval_keys(self) -> list[str]:
        return sorted({k for r in self.evals for k in r if k.startswith(("val_", "dev_"))})


def _split(records: list[tuple[int, dict]], source: Path) -> RunMetrics:
    """Training records (with ``loss``) and evaluation records (a ``val_*`` / ``dev_*`` key), the later record
    for a step winning (a resumed run repeats the steps after its checkpoint)."""
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    for lineno, rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise DataError("expected an object with an integer \"step\"", str(source), lineno or None)
        if "loss" in rec:
            train[rec["step"]] = rec
        if any(k.startswith(("val_", "dev_")) for k in rec):
            evals.setdefault(rec["step"], {}).update(rec)
    return RunMetrics(source, [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)])


def read_run(run_dir: Path) -> RunMetrics:
    """The metrics of ``run_dir`` (see the module docstring); a DataError when it has none or they are empty."""
    if not run_dir.is_dir():
        raise DataError("not a folder (expected a pretraining or fine-tuning run folder)", str(run_dir))
    jsonl = run_dir / "metrics.jsonl"
    if jsonl.is_file():
        metrics = _split(list(iter_json_lines(jsonl)), jsonl)
    else:
        hist_file = next((p for p in (run_dir / "results.json", run_dir / "resume" / "state.json") if p.is_file()),
                         None)
        if hist_file is None:
            seeds = sorted(p.name for p in run_dir.glob("seed*") if (p / "results.json").is_file())
            hint = f" (a fine-tuning sweep: pass one of its runs, e.g. {run_dir / seeds[0]})" if seeds else ""
            raise DataError(f"no metrics.jsonl, results.json or resume/state.json: not a run folder{hint}",
                            str(run_dir))
        saved = load_json(hist_file)
        history = saved.get("history") if isinstance(saved, dict) else None
        if not isinstance(history, list):
            raise DataError("no \"history\" list of per-step records", str(hist_file))
        metrics = _split([(0, r) for r in history], hist_file)
    if not metrics.train and not metrics.evals:
        raise DataError("no training or evaluation records (an empty run: nothing to plot)", str(metrics.source))
    return metrics


def _plot(path: Path, title: str, ylabel: str, lines: list[tuple[str, list[int], list[float], str]],
          log_y: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, style, label=label, markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log_y and all(v > 0 for _, _, ys, _ in lines for v in ys):
        ax.set_yscale("log")
    if len(lines) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _figures(m: RunMetrics) -> list[tuple[str, str, list, str, bool]]:
    """(file name, title, lines, y label, log y) of every plot the records allow; a plot with no data is left out."""
    figs = []
    loss = m.series("loss")
    val = m.series("val_loss", evals=True)
    lines = [("train loss", *loss, "-")] if loss[0] else []
    lines += [("validation loss", *val, "o-")] if val[0] else []
    if lines:
        figs.append(("loss.png", "Loss", lines, "loss (nats)", False))
    for key, title, ylabel, log_y in (("lr", "Learning rate", "lr", False),
                                      ("grad_norm", "Gradient norm", "grad norm", True)):
        xs, ys = m.series(key)
        if xs:
            figs.append((f"{key}.png", title, [(key, xs, ys, "-")], ylabel, log_y))
    for key in [k for k in m.eval_keys() if k != "val_loss"]:
        xs, ys = m.series(key, evals=True)
        if xs:
            what = key.split("_", 1)[1]
            figs.append((f"{key}.png", f"{'Dev' if key.startswith('dev_') else 'Validation'} {what} per evaluation",
                         [(key, xs, ys, "o-")], what, False))
    for key in THROUGHPUT_KEYS:
        xs, ys = m.series(key)
        if xs:
            figs.append(("throughput.png", f"Throughput ({key.replace('_per_sec', '')}/s)",
                         [(key, xs, ys, "-")], key.replace("_per_sec", "/s"), False))
            break
    return figs


def _not_recorded(m: RunMetrics, names: set[str]) -> list[str]:
    want = {"loss.png": "loss", "lr.png": "learning rate", "grad_norm.png": "gradient norm",
            "throughput.png": "throughput (tokens/s or examples/s)"}
    missing = [what for f, what in want.items() if f not in names]
    if not m.evals:
        missing.append("evaluations (validation loss / dev metric)")
    return missing


def _summary(run_dir: Path, m: RunMetrics) -> list[tuple[str, str]]:
    rows = [("run", str(run_dir)), ("read from", str(m.source))]
    if m.train:
        first, last = m.train[0], m.train[-1]
        rows.append(("steps", f"{first['step']} - {last['step']} ({len(m.train)} records)"))
        if isinstance(last.get("loss"), (int, float)):
            rows.append(("final train loss", f"{last['loss']:.4f} at step {last['step']}"))
    for key in m.eval_keys():
        xs, ys = m.series(key, evals=True)
        if xs:
            best = min(ys) if key.endswith("loss") else max(ys)
            rows.append((key, f"last {ys[-1]:.4f} (step {xs[-1]}), best {best:.4f} (step {xs[ys.index(best)]})"))
    return rows


def _html(run_dir: Path, m: RunMetrics, figs: list, missing: list[str]) -> str:
    e = html.escape
    rows = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary(run_dir, m))
    imgs = "\n".join(f'<figure><img src="{e(name)}" alt="{e(title)}"><figcaption>{e(title)}</figcaption></figure>'
                     for name, title, *_ in figs)
    note = (f"<p>Not recorded by this run: {e(', '.join(missing))}.</p>" if missing else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>bio-megatron report: {e(run_dir.name)}</title>\n"
            "<style>body{font-family:sans-serif;margin:2em;max-width:70em}th{text-align:left;padding-right:1em}"
            "figure{display:inline-block;margin:0.5em}img{max-width:100%}</style></head>\n"
            f"<body><h1>{e(run_dir.name)}</h1>\n<table>\n{rows}\n</table>\n{note}\n{imgs}\n</body></html>\n")


def write_run_report(run_dir: Path, out: Path, overwrite: bool = False) -> list[str]:
    """Write ``out/index.html`` and its PNGs for ``run_dir``; returns the files written. ``out`` is replaced
    only when absent, empty, or (``overwrite``) an earlier ``report`` output with no files added since."""
    m = read_run(run_dir)
    figs = _figures(m)
    with atomic_path(out, command=COMMAND, overwrite=overwrite) as tmp:
        tmp.mkdir()
        for name, title, lines, ylabel, log_y in figs:
            _plot(tmp / name, title, ylabel, lines, log_y)
        (tmp / "index.html").write_text(_html(run_dir, m, figs, _not_recorded(m, {f[0] for f in figs})),
                                        encoding="utf-8")
    log.info("report of %s (%d plots, from %s): %s", run_dir, len(figs), m.source.name, out / "index.html")
    return ["index.html"] + [f[0] for f in figs]
