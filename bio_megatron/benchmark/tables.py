"""A suite's results beside ``results.md``: ``results.csv`` (one row per dataset and metric, the task-type
averages and the BLURB score), ``results.tex`` (a LaTeX ``tabular`` per table of ``results.md``) and
``plots/<dataset>.png`` (each seed's score, with the mean and s.d. across seeds).

All of it is built from the ``results.json`` object (report.build_results), so the numbers are the Markdown's.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from bio_megatron.utils.io import atomic_path

CSV_FIELDS = ("suite", "model", "kind", "group", "dataset", "title", "split", "metric", "metric_name", "n", "mean",
              "std", "median", "min", "max", "seeds", "status", "reason")
PLOTS_COMMAND = "benchmark report"
_TEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def _name(res: dict) -> str:
    return res.get("model_name") or Path(res["model"]).name


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def results_csv(res: dict) -> str:
    """One row per dataset x metric (its columns, or its headline metric), then the task-type averages and the
    BLURB score for BLURB; a dataset without a finished cell keeps a row with its status and why. n=1: std empty."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    base = {"suite": res["suite"], "model": _name(res)}
    for r in res["datasets"]:
        cols = [tuple(c) for c in r["columns"]]
        if r["metric"] not in dict(cols):
            cols.append((r["metric"], r["metric_name"]))
        for key, title in cols:
            s = (r.get("stats") or {}).get(key)
            row = {**base, "kind": "dataset", "group": r["group"], "dataset": r["key"], "title": r["title"],
                   "split": r["split"], "metric": key, "metric_name": title, "status": r["status"],
                   "seeds": " ".join(map(str, r.get("seeds", []))), "reason": r.get("reason") or ""}
            if s:
                row.update(n=s["n"], mean=_num(s["mean"]), std=_num(s["std"]) if s["n"] > 1 else "",
                           median=_num(s["median"]), min=_num(s["min"]), max=_num(s["max"]))
            w.writerow(row)
    for t in res.get("task_types") or []:
        w.writerow({**base, "kind": "task_type_average", "group": t["task_type"], "n": len(t["datasets"]),
                    "mean": _num(t["average"]), "reason": f"without {', '.join(t['missing'])}" if t["missing"] else ""})
    if res.get("task_types") is not None:
        full = res.get("blurb_score")
        w.writerow({**base, "kind": "blurb_score" if full is not None else "blurb_score_partial",
                    "mean": _num(full if full is not None else res.get("blurb_score_partial"))})
    return buf.getvalue()


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def _tex_value(s: dict | None) -> str:
    if not s:
        return "--"
    return f"{s['mean']:.2f}" if s["n"] == 1 else f"{s['mean']:.2f} $\\pm$ {s['std']:.2f}"


def results_tex(res: dict) -> str:
    """A ``tabular`` (booktabs) per task type: dataset, then each of its metrics as mean $\\pm$ s.d. (a lone seed:
    its score), then the seeds; BLURB adds the task-type averages and the BLURB score."""
    out = [f"% {res['title']}: {tex_escape(_name(res))} (bio-megatron benchmark report; 0-100 scale, "
           "mean $\\pm$ sample s.d. over seeds; a single seed has no spread)", "% needs \\usepackage{booktabs}"]
    groups = list(dict.fromkeys(r["group"] for r in res["datasets"]))
    for group in groups:
        rows = [r for r in res["datasets"] if r["group"] == group and r["status"] != "not selected"]
        if not rows:
            continue
        cols = list(dict.fromkeys(tuple(c) for r in rows for c in r["columns"]))
        head = ["Dataset", "Model", *[tex_escape(t) for _, t in cols], "Seeds"]
        out += ["", f"% {tex_escape(group)}", "\\begin{tabular}{l" + "l" + "r" * (len(cols) + 1) + "}",
                "\\toprule", " & ".join(head) + " \\\\", "\\midrule"]
        for r in rows:
            vals = [_tex_value((r.get("stats") or {}).get(k)) if any(k == c[0] for c in r["columns"]) else ""
                    for k, _ in cols]
            out.append(" & ".join([tex_escape(r["title"]), tex_escape(_name(res)), *vals,
                                   str(len(r.get("seeds", [])))]) + " \\\\")
        avg = next((t for t in res.get("task_types") or [] if t["task_type"] == group), None)
        if avg is not None:
            out += ["\\midrule", f"\\emph{{{tex_escape(group)} average}} & & "
                    + " & ".join([f"{avg['average']:.2f}" if avg["average"] is not None else "--"]
                                 + [""] * (len(cols) - 1)) + " & \\\\"]
        out += ["\\bottomrule", "\\end{tabular}"]
    if res.get("task_types") is not None:
        score = res.get("blurb_score")
        label = "BLURB score" if score is not None else "BLURB score (partial)"
        value = score if score is not None else res.get("blurb_score_partial")
        out += ["", f"% {label}: {value:.2f}" if value is not None else f"% {label}: n/a"]
    return "\n".join(out) + "\n"


def write_plots(res: dict, folder: Path) -> list[str]:
    """``folder/<dataset>.png`` for every dataset with a finished cell: each seed's headline score (a point per
    seed) with the mean and, for two seeds or more, mean $\\pm$ s.d. Written as one folder output (replacing only
    an earlier ``benchmark report`` plots folder); returns the files, relative to the suite folder."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    by_key: dict[str, list[tuple[int, float]]] = {}
    for c in res["cells"]:
        if c["status"] == "finished":
            ds = next(r for r in res["datasets"] if r["key"] == c["dataset"])
            chosen = ds.get("selected")
            if chosen and c["grid"] and tuple(c["grid"]) != (chosen["num_fc_layers"], chosen["fc_hidden_size"]):
                continue  # the table reports the grid point chosen on dev: plot the same cells
            if ds["metric"] in c["scores"]:
                by_key.setdefault(c["dataset"], []).append((c["seed"], c["scores"][ds["metric"]]))
    written = []
    with atomic_path(folder, command=PLOTS_COMMAND, overwrite=True) as tmp:
        tmp.mkdir()
        for r in res["datasets"]:
            points = sorted(by_key.get(r["key"], []))
            s = (r.get("stats") or {}).get(r["metric"])
            if not points or not s:
                continue
            fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=100)
            xs = list(range(len(points)))
            ax.scatter(xs, [v for _, v in points], color="tab:blue", zorder=3, label="seed")
            ax.axhline(s["mean"], color="tab:orange", label=f"mean {s['mean']:.2f}")
            if s["n"] > 1:
                ax.axhspan(s["mean"] - s["std"], s["mean"] + s["std"], color="tab:orange", alpha=0.2,
                           label=f"± s.d. {s['std']:.2f}")
            ax.set_xticks(xs, [str(seed) for seed, _ in points])
            ax.set_xlabel("seed")
            ax.set_ylabel(f"{r['metric_name']} ({r['split']})")
            ax.set_title(f"{r['title']}: {_name(res)} (n={s['n']})", fontsize=9)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(tmp / f"{r['key']}.png", format="png")
            plt.close(fig)
            written.append(f"{folder.name}/{r['key']}.png")
    return written


def steps_plot(summary: dict, titles: dict[str, tuple[str, str]], path: Path, name: str | None = None) -> None:
    """One PNG: each dataset's headline score (0-100) against the pretraining step of the checkpoint it was
    fine-tuned from (the BioMegatron paper's Table 5 as a plot); steps without a finished cell are gaps."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=100)
    for key in summary["datasets"]:
        pts = [(r["step"], r["scores"][key]) for r in summary["steps"] if r["scores"].get(key) is not None]
        if pts:
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=f"{titles[key][0]} ({titles[key][1]})")
    ax.set_xlabel("pretraining step")
    ax.set_ylabel(f"score (0-100, {summary['statistic']} over seeds)")
    ax.set_title(f"{summary['title']}: {name or Path(summary['model']).name}", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
