"""``results.json`` and ``results.md`` of a suite folder, rebuilt from its cells at any time.

Inputs are the folder's ``manifest.json`` (suite, model, options), ``plan.json`` (every cell, with the reason
when it is missing) and each cell's ``cell.json`` (finished) or ``error.json`` (failed). The same files always
give byte-identical outputs. Layouts: BLURB's table (datasets grouped by task type, BLURB's metric names,
task-type averages, the BLURB score) and the paper's Tables 1-2 (P/R/F1; SAcc/LAcc/MRR), every value on the
0-100 scale as mean ± sample s.d. over seeds with the median (one seed: its score, no spread). The same
numbers go to ``results.csv`` and ``results.tex`` (benchmark/tables.py) with per-dataset plots in ``plots/``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bio_megatron.benchmark.stats import blurb_score, select_point, spread, task_type_averages
from bio_megatron.benchmark.suites import SUITES, Dataset, Suite
from bio_megatron.utils.errors import BioMegatronError, ConfigError
from bio_megatron.utils.io import atomic_open, load_json, write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
MANIFEST, PLAN, RESULT, ERROR = "manifest.json", "plan.json", "cell.json", "error.json"
# The vocabularies shipped with the package, by the names the paper's Vocabulary column gives them.
_BUILTIN_NAMES = {"bert_base_cased": "BERT-cased", "bert_base_uncased": "BERT-uncased"}


def collect(out: Path) -> tuple[dict, list[dict]]:
    """(manifest, plan cells with ``status`` and, when finished, the cell record) of a suite folder."""
    if not (out / MANIFEST).is_file() or not (out / PLAN).is_file():
        raise ConfigError(f"{out}: not a benchmark suite folder (no {MANIFEST} / {PLAN}); run "
                          "`bio-megatron benchmark blurb|paper --out` first")
    manifest, plan = load_json(out / MANIFEST), load_json(out / PLAN)
    cells = []
    for c in plan["cells"]:
        c = dict(c)
        d = out / c["dir"]
        if (d / RESULT).is_file():
            c.update(status="finished", record=load_json(d / RESULT))
        elif c["missing"]:
            c["status"] = "missing"
        elif (d / ERROR).is_file():
            c.update(status="failed", error=load_json(d / ERROR).get("message", ""))
        else:
            c["status"] = "pending"
        cells.append(c)
    return manifest, cells


def model_facts(model: Path) -> dict | None:
    """The paper's #Parameters and Vocabulary of the model a suite fine-tunes (our checkpoint or an HF folder):
    the parameter count ``pretrain --dry-run`` gives for its shape and padded vocabulary (encoder and MLM head,
    no NSP head: fine-tuning does not use it), and its vocabulary's name and size. None (logged) when the model
    cannot be read here."""
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families import family_of_model
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.vocab.bpe import is_bpe, load_tokenizer
    from bio_megatron.vocab.builtin import BUILTIN, VOCAB_DIR
    from bio_megatron.vocab.wordpiece import guess_lowercase, read_vocab

    try:
        src = resolve_source(model)
        tok = load_tokenizer(src.vocab_file)
        m = ModelConfig(**src.shape)
        padded = src.padded_vocab or padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by)
        n = family_of_model(m).parameter_count(m, padded)  # the family's own exact count (no NSP/SOP head)
        if is_bpe(src.vocab_file):
            name = "byte-level BPE"
        else:
            words = read_vocab(src.vocab_file)
            name = next((_BUILTIN_NAMES[k] for k, f in BUILTIN.items() if read_vocab(VOCAB_DIR / f) == words),
                        f"WordPiece-{'uncased' if guess_lowercase(words) else 'cased'}")
    except (BioMegatronError, OSError, TypeError) as exc:  # TypeError: a shape key ModelConfig does not know
        log.warning("%s: #Parameters and Vocabulary left empty: %s", model, exc)
        return None
    return {"parameters": n, "parameters_text": _count(n), "vocab_size": tok.vocab_size, "padded_vocab_size": padded,
            "vocabulary": f"{name} ({tok.vocab_size:,})"}


def _count(n: int) -> str:
    """The paper's spelling: 110m, 345m, 1.2b (one decimal below 10m)."""
    return f"{n / 1e9:.1f}b" if n >= 1e9 else f"{n / 1e6:.0f}m" if n >= 1e7 else f"{n / 1e6:.1f}m"


def _dataset_summary(d: Dataset, cells: list[dict], seeds: int) -> dict:
    mine = [c for c in cells if c["dataset"] == d.key]
    row = {"key": d.key, "title": d.title, "group": d.group, "metric": d.metric, "metric_name": d.metric_name,
           "split": d.split, "columns": [list(c) for c in d.columns] or [[d.metric, d.metric_name]]}
    done = [c for c in mine if c["status"] == "finished"]
    if not done:
        missing = next((c for c in mine if c["status"] == "missing"), None)
        failed = next((c for c in mine if c["status"] == "failed"), None)
        row["status"] = "missing" if missing else "failed" if failed else "pending"
        row["reason"] = (missing or {}).get("missing") or (failed or {}).get("error")
        return row
    dev_by_point: dict = {}
    for c in done:
        dev_by_point.setdefault(_point(c), []).append(c["record"]["dev_value"])
    point, complete = select_point(dev_by_point, seeds)
    chosen = sorted((c for c in done if _point(c) == point), key=lambda c: c["index"])
    keys = [k for k, _ in row["columns"]] + ([d.metric] if d.metric not in dict(row["columns"]) else [])
    row.update(status="complete" if complete else "partial", seeds=[c["seed"] for c in chosen],
               stats={k: spread([c["record"]["scores"][k] for c in chosen]) for k in keys
                      if all(k in c["record"]["scores"] for c in chosen)})
    if point is not None:
        row["selected"] = {"num_fc_layers": point[0], "fc_hidden_size": point[1], "dev_mean": sum(
            dev_by_point[point]) / len(dev_by_point[point])}
        row["grid"] = [{"num_fc_layers": p[0], "fc_hidden_size": p[1], "dev_mean": sum(v) / len(v), "n": len(v)}
                       for p, v in sorted(dev_by_point.items())]
    return row


def _point(c: dict):
    return tuple(c["point"]) if c.get("point") else None


def build_results(suite: Suite, manifest: dict, cells: list[dict], model: dict | None = None) -> dict:
    """The whole results object from the manifest, the collected cells and ``model_facts`` (pure: tests feed
    synthetic cells)."""
    opts = manifest["options"]
    runs = opts.get("runs") or {}
    chosen = [d for d in suite.datasets if d.key in opts["datasets"]]
    datasets = [_dataset_summary(d, cells, runs.get(d.key, len(opts["seeds"]))) if d in chosen else
                {"key": d.key, "title": d.title, "group": d.group, "metric": d.metric, "metric_name": d.metric_name,
                 "split": d.split, "columns": [list(c) for c in d.columns] or [[d.metric, d.metric_name]],
                 "status": "not selected", "reason": "not in --datasets"} for d in suite.datasets]
    counts = {s: sum(c["status"] == s for c in cells) for s in ("finished", "missing", "failed", "pending")}
    out = {"suite": suite.name, "title": suite.title, "suite_version": suite.version, "model": manifest["model"],
           "model_facts": model, "seeds": opts["seeds"], "runs": runs, "grid": opts["grid"], "options": opts,
           "scale": "0-100", "cells_total": len(cells), "cells": [_cell_row(c) for c in cells],
           **{f"cells_{s}": n for s, n in counts.items()}, "datasets": datasets}
    if suite.means:  # the publication's group means over each dataset's headline (bio-lm: of the medians)
        head = {r["key"]: r["stats"][r["metric"]][suite.statistic] if r.get("stats", {}).get(r["metric"]) else None
                for r in datasets}
        out["statistic"] = suite.statistic
        out["group_means"] = [{"name": name, "mean": statistics.fmean(head[k] for k in keys if head[k] is not None)
                               if any(head[k] is not None for k in keys) else None,
                               "datasets": [k for k in keys if head[k] is not None],
                               "missing": [k for k in keys if head[k] is None]} for name, keys in suite.means]
    if suite.blurb_score:
        means = {r["key"]: r["stats"][r["metric"]]["mean"] if r.get("stats", {}).get(r["metric"]) else None
                 for r in datasets}
        types = task_type_averages(means, {d.key: d.group for d in suite.datasets}, suite.groups)
        full = len(chosen) == len(suite.datasets) and all(r["status"] == "complete" for r in datasets)
        score = blurb_score(types)
        out.update(task_types=types, blurb_score=score if full else None,
                   blurb_score_partial=None if full else score)
    return out


def _cell_row(c: dict) -> dict:
    row = {"index": c["index"], "dataset": c["dataset"], "seed": c["seed"], "grid": c.get("point"),
           "status": c["status"], "dir": c["dir"]}
    if c["status"] == "finished":
        r = c["record"]
        row.update(scores=r["scores"], dev_value=r["dev_value"], wall_seconds=r["wall_seconds"],
                   run_dir=r["run_dir"])
    elif c["status"] in ("missing", "failed"):
        row["reason"] = c.get("missing") or c.get("error")
    return row


def _value(stats: dict | None, with_median: bool = True) -> str:
    """mean ± s.d. (median); one seed has no spread to show: its score alone ("75.31"; the Seeds column says 1)."""
    if not stats:
        return ""
    if stats.get("n", 2) == 1:
        return f"{stats['mean']:.2f}"
    text = f"{stats['mean']:.2f} ± {stats['std']:.2f}"
    return text + (f" (median {stats['median']:.2f})" if with_median else "")


def _why(row: dict, limit: int = 160) -> str:
    text = f"{row['status']}: {row.get('reason') or 'no finished cell yet'}".replace("|", "/")
    return text if len(text) <= limit else text[:limit - 3] + "..."  # in full under "Missing and failed cells"


def blurb_markdown(res: dict) -> str:
    lines = _header(res) + ["| Task type | Dataset | Metric | Score (mean ± s.d.) | Median | Seeds |",
                            "|---|---|---|---|---|---|"]
    for t in res["task_types"]:
        rows = [r for r in res["datasets"] if r["group"] == t["task_type"]]
        if not rows:
            continue
        for i, r in enumerate(rows):
            s = r.get("stats", {}).get(r["metric"])
            score, median = (_value(s, False), f"{s['median']:.2f}") if s else (_why(r), "")
            lines.append(f"| {t['task_type'] if i == 0 else ''} | {r['title']} | {r['metric_name']} | {score} | "
                         f"{median if s and s['n'] > 1 else ''} | {len(r.get('seeds', []))} |")
        avg = f"**{t['average']:.2f}**" if t["average"] is not None else "n/a"
        titles = {r["key"]: r["title"] for r in rows}
        note = f" (without {', '.join(titles[k] for k in t['missing'])})" if t["missing"] and t["average"] is not None \
            else ""
        lines.append(f"| | *{t['task_type']} average*{note} | | {avg} | | |")
    score = res["blurb_score"] if res["blurb_score"] is not None else res["blurb_score_partial"]
    label = "BLURB score" if res["blurb_score"] is not None else "BLURB score (partial: not every dataset complete)"
    lines.append(f"| **{label}** | | macro average of the task-type averages | "
                 f"{f'**{score:.2f}**' if score is not None else 'n/a'} | | |")
    return "\n".join(lines + [""] + _problems(res)).rstrip("\n") + "\n"


def paper_markdown(res: dict) -> str:
    lines = _header(res)
    model = display_name(res)
    mf = res.get("model_facts")
    facts = [mf["parameters_text"], mf["vocabulary"]] if mf else ["", ""]
    for group in SUITES[res["suite"]].groups:
        rows = [r for r in res["datasets"] if r["group"] == group]
        # one table per split and column set: the reported test scores, then a prerequisite's dev scores
        tables = dict.fromkeys((r["split"], tuple(map(tuple, r["columns"])))
                               for r in sorted(rows, key=lambda r: r["split"] != "test"))
        for n, (split, cols) in enumerate(tables):
            part = [r for r in rows if (r["split"], tuple(map(tuple, r["columns"]))) == (split, cols)]
            title = f"## {group} ({split})" if n == 0 else \
                f"### {', '.join(r['title'] for r in part)} ({split}; the checkpoints the runs above continue from)"
            head = ["Benchmark", "Model", "#Parameters", "Vocabulary",
                    *(["Head (chosen on dev)"] if res["grid"] else []), *[h for _, h in cols], "Seeds"]
            lines += ([""] if lines[-1] else []) + [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for r in part:
                sel = r.get("selected")
                grid = [f"{sel['num_fc_layers']} x {sel['fc_hidden_size']}" if sel else ""] if res["grid"] else []
                vals = [_value(r["stats"].get(k)) for k, _ in cols] if r.get("stats") else \
                    [_why(r)] + [""] * (len(cols) - 1)
                lines.append("| " + " | ".join([r["title"], model, *facts, *grid, *vals, str(len(r.get("seeds", [])))])
                             + " |")
    return "\n".join(lines + [""] + _problems(res)).rstrip("\n") + "\n"


def median_markdown(res: dict) -> str:
    """bio-lm's layout: each task's median over seeds (its Table 2), then its group means (Tables 3-4) over the
    medians, each saying which tasks it lacks."""
    lines = _header(res) + ["| Task | Type | Metric | Median | Mean ± s.d. | Seeds |", "|---|---|---|---|---|---|"]
    for r in res["datasets"]:
        s = (r.get("stats") or {}).get(r["metric"])
        median, spread_ = (f"**{s['median']:.2f}**", _value(s, False)) if s else (_why(r), "")
        lines.append(f"| {r['title']} | {r['group']} | {r['metric_name']} | {median} | {spread_} | "
                     f"{len(r.get('seeds', []))} |")
    titles = {r["key"]: r["title"] for r in res["datasets"]}
    for g in res.get("group_means") or []:
        note = f" (without {', '.join(titles[k] for k in g['missing'])})" if g["missing"] and g["mean"] is not None \
            else ""
        value = f"**{g['mean']:.2f}**" if g["mean"] is not None else "n/a"
        lines.append(f"| *{g['name']}*{note} | | mean of the medians | {value} | | |")
    return "\n".join(lines + [""] + _problems(res)).rstrip("\n") + "\n"


def _header(res: dict) -> list[str]:
    o = res["options"]
    extra = [f"--max-examples {o['max_examples']} (a random sample, seed {o.get('sample_seed', 'none: the first rows')})"
             ] if o.get("max_examples") else []
    extra += [f"--epochs {o['epochs']}"] if o.get("epochs") else []
    mf = res.get("model_facts")
    about = f" ({mf['parameters']:,} parameters, vocabulary {mf['vocabulary']})" if mf else ""
    return [f"# {res['title']}: {display_name(res)}", "",
            f"Model `{res['model']}`{about}; seeds {_seeds_text(res)}"
            + ("; head grid, the point with the best mean dev score kept" if res["grid"] else "")
            + (f"; {' '.join(extra)} (a smoke run, not the protocol)" if extra else "")
            + f". Scores on a 0-100 scale: mean ± sample s.d. over seeds (one seed: its score, n=1). Cells: {res['cells_finished']} finished, "
            f"{res['cells_missing']} missing, {res['cells_failed']} failed, {res['cells_pending']} pending "
            f"of {res['cells_total']}.", ""]


def _seeds_text(res: dict) -> str:
    """The seeds, and which datasets run how many of them when that is the publications' number per dataset."""
    runs, seeds = res.get("runs") or {}, res["seeds"]
    if not runs:
        return ", ".join(map(str, seeds))
    titles = {r["key"]: r["title"] for r in res["datasets"]}
    counts = sorted(set(runs.values()))
    parts = [f"the first {n} for {', '.join(titles[k] for k in runs if runs[k] == n)}" for n in counts]
    return f"{', '.join(map(str, seeds[:max(counts)]))} ({'; '.join(parts)})"


def _problems(res: dict) -> list[str]:
    """One line per dataset and reason (the seeds and grid points it applies to listed)."""
    groups: dict[tuple, list[str]] = {}
    for c in res["cells"]:
        if c["status"] in ("missing", "failed"):
            where = f"{c['seed']}" + (f" (grid {c['grid'][0]} x {c['grid'][1]})" if c["grid"] else "")
            groups.setdefault((c["dataset"], c["status"], c.get("reason")), []).append(where)
    if not groups:
        return []
    return ["## Missing and failed cells", ""] + [f"- {key} seed(s) {', '.join(seeds)}: {status}: {reason}"
                                                  for (key, status, reason), seeds in groups.items()] + [""]


def display_name(res: dict) -> str:
    """The model's name in the tables: ``--name``, else its folder's name."""
    return res.get("model_name") or Path(res["model"]).name


def write_report(out: Path, name: str | None = None, plots: bool = True) -> dict:
    """Rebuild ``results.json``, ``results.md``, ``results.csv``, ``results.tex`` and (``plots``) the per-dataset
    plots of ``plots/`` of the suite folder ``out`` from its cells; ``name``: the model's display name."""
    from bio_megatron.benchmark.tables import results_csv, results_tex, write_plots

    manifest, cells = collect(out)
    suite = SUITES[manifest["suite"]]
    # a NeMo / Megatron-LM source was imported into the suite folder: that is the model the cells fine-tune
    model = out / "model" if manifest.get("model_kind") in ("nemo", "megatron-lm") else Path(manifest["model"])
    res = build_results(suite, manifest, cells, model_facts(model))
    if name:
        res["model_name"] = name
    if plots:
        res["plots"] = write_plots(res, out / "plots")
    write_json_atomic(out / "results.json", res)
    with atomic_open(out / "results.md", "w", encoding="utf-8") as fh:
        fh.write(blurb_markdown(res) if suite.blurb_score else median_markdown(res) if suite.statistic == "median"
                 else paper_markdown(res))
    with atomic_open(out / "results.csv", "w", encoding="utf-8", newline="") as fh:
        fh.write(results_csv(res))
    with atomic_open(out / "results.tex", "w", encoding="utf-8") as fh:
        fh.write(results_tex(res))
    return res
