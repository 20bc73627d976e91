"""Running a suite's cells, resumably: a cell is done when its ``cell.json`` exists (written atomically, last);
done cells are never run again, an unfinished one starts over, its fine-tuning continuing from
``<run>/resume`` where a stop request left one (``finetune`` itself does that), and a finished fine-tuning
whose scoring was cut off is only scored.

After the fine-tuning a cell is scored: the run's own scores come from the official-equivalent metrics
(conlleval, ChemProt micro-F1, SQuAD, BioASQ, BLURB's), and where the dataset has a ``bio-megatron evaluate``
command the run's test predictions are scored again by it against the gold file; that score is the one
reported (it must equal the run's; a difference is logged).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
import time
from pathlib import Path

from bio_megatron.benchmark.launch import EX_INTERRUPTED, Launcher, StopRequest, wait
from bio_megatron.benchmark.plan import Cell, Plan
from bio_megatron.benchmark.report import ERROR, write_report
from bio_megatron.utils.errors import ConfigError, DataError
from bio_megatron.utils.io import load_json, write_json_atomic
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
ALIASES = {"exact_match": "exact"}  # SQuAD v1.1's scorer says exact_match, v2.0's exact


def done(cell: Cell) -> bool:
    return cell.result_file.is_file()


def _run_finished(cell: Cell) -> bool:
    path = cell.run_dir / "results.json"
    try:
        return path.is_file() and json.loads(path.read_text()).get("status") == "finished"
    except ValueError:
        return False


def _log_tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-n:])


def score(cell: Cell, plan: Plan) -> dict:
    """The cell record from the run's ``results.json`` (and the evaluator, where the dataset has one)."""
    d = cell.dataset
    res = load_json(cell.run_dir / "results.json")
    if res.get("protocol") == "k-fold":  # the median over the reported folds; dev: the tuning fold's (kfold.py)
        tuning = next((r for r in res["folds"] if r["tuning"]), {})
        res = {**res, d.split: {res["metric"]: res["test"]["median"]} if res.get("test") else None,
               "dev": {res["metric"]: tuning.get("dev")}}
    raw = res.get(d.split)
    if not raw:
        raise DataError(f"the run reported no {d.split} scores (model.dataset.{d.split}_file unset?)",
                        str(cell.run_dir / "results.json"))
    source, evaluation = dict(raw), None
    if d.evaluator and d.split == "test":
        evaluation = _evaluate(cell, plan, res)
        if "score" in evaluation:
            if "score" in raw and not math.isclose(raw["score"], evaluation["score"], abs_tol=1e-9):
                log.warning("%s: `evaluate %s` scores %.6f, the run %.6f: the evaluator's is reported", cell.label,
                            d.evaluator, evaluation["score"], raw["score"])
            source = evaluation
    keys = [k for k, _ in d.columns] + [d.metric]
    source = {**{k: source[a] for k, a in ALIASES.items() if a in source and k not in source}, **source}
    scores = {k: source[k] * d.scale for k in dict.fromkeys(keys) if isinstance(source.get(k), (int, float))}
    if d.metric not in scores:
        raise DataError(f"no {d.metric!r} ({d.metric_name}) among the scores {sorted(source)}",
                        str(cell.run_dir / "results.json"))
    dev = res.get("dev") or {}
    return {"dataset": d.key, "seed": cell.seed,
            "grid": {"num_fc_layers": cell.point[0], "fc_hidden_size": cell.point[1]} if cell.point else None,
            "status": "finished", "split": d.split, "metric": d.metric, "scores": scores,
            "dev_value": dev.get(d.metric, dev.get("f1")), "raw": {"dev": dev, d.split: raw},
            "evaluation": evaluation, "run_dir": str(cell.run_dir.relative_to(plan.out)),
            "checkpoint": res.get("checkpoint"), "train_seconds": res.get("train_seconds"),
            "command": ["bio-megatron", *cell.finetune_args()]}


def _evaluate(cell: Cell, plan: Plan, res: dict) -> dict:
    """``bio-megatron evaluate <task> --gold <test file> --pred <run>/test_predictions...`` (its functions)."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.evaluation.blurb import as_dict
    from bio_megatron.tasks.blurb_scoring import EVALUATORS, METRIC_VARIANTS

    d = cell.dataset
    ds = load_finetune_config(d.task, cell.recipe, cell.overrides).model.dataset
    gold, pred = Path(ds.data_dir) / ds.test_file, res.get("test_predictions")
    words = ["bio-megatron", "evaluate", d.evaluator, "--gold", str(gold), "--pred", str(pred)]
    scorer = EVALUATORS[d.evaluator].score
    if d.evaluator_metric:
        words += ["--metric", d.evaluator_metric]
        scorer = METRIC_VARIANTS[(d.evaluator, d.evaluator_metric)]
    command = shlex.join(words)  # recorded and printed: it must paste into a shell (paths with spaces)
    if not pred:
        if d.needs_predictions:
            raise DataError(f"the run wrote no test predictions for `{command}`", str(cell.run_dir / "results.json"))
        return {"skipped": "the run wrote no test predictions", "command": command}
    try:
        return {**as_dict(scorer(str(gold), pred), d.evaluator), "command": command}
    except DataError as exc:
        if plan.options.max_examples is None or d.needs_predictions:
            raise
        # --max-examples cut the test split: predictions cover only its first N examples of the gold file
        return {"skipped": f"--max-examples {plan.options.max_examples} cut the test split ({exc})",
                "command": command}


def _run_cell(cell: Cell, plan: Plan, launcher: Launcher, stop: StopRequest) -> str:
    """Fine-tune (unless the run already finished) and score one cell: "done", "failed" or "interrupted"."""
    t0 = time.monotonic()
    if not _run_finished(cell):
        log.info("cell %d/%d start: %s", cell.index + 1, len(plan.cells), cell.label)
        child = launcher.start(cell.finetune_args(), cell.dir / "finetune.log")
        try:
            rc = wait(child, stop)
        except BaseException:
            child.signal(15)  # Ctrl-C: a torchrun child in its own session must not outlive the suite
            raise
        if not _run_finished(cell):
            if stop.signum is not None:  # saved <run>/resume (exit 0), or stopped before it began training
                return "interrupted"
            why = f"fine-tuning exited with {rc}" + (" (diverged)" if rc == 3 else "") if rc else \
                "fine-tuning exited 0 without a finished results.json"
            write_json_atomic(cell.dir / ERROR, {"rc": rc, "message": f"{why}: {_log_tail(cell.dir / 'finetune.log')}",
                                                 "log": str(cell.dir / "finetune.log")})
            log.error("cell %d/%d failed: %s: %s (log: %s)", cell.index + 1, len(plan.cells), cell.label, why,
                      cell.dir / "finetune.log")
            return "failed"
    try:
        record = score(cell, plan)
    except DataError as exc:
        write_json_atomic(cell.dir / ERROR, {"rc": None, "message": f"scoring failed: {exc}"})
        log.error("cell %d/%d failed: %s: scoring: %s", cell.index + 1, len(plan.cells), cell.label, exc)
        return "failed"
    record.update(wall_seconds=round(time.monotonic() - t0, 2),
                  finished=_dt.datetime.now().isoformat(timespec="seconds"))
    write_json_atomic(cell.result_file, record)  # last: its existence is what "done" means
    (cell.dir / ERROR).unlink(missing_ok=True)
    return "done"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds // 3600:.0f} h {seconds % 3600 / 60:02.0f} min"


def _progress(cell: Cell, plan: Plan) -> str:
    finished = [c for c in plan.cells if done(c)]
    walls = [load_json(c.result_file).get("wall_seconds", 0.0) for c in finished]
    left = [c for c in plan.cells if not done(c) and not c.missing]
    eta = _duration(sum(walls) / len(walls) * len(left)) if walls and left else "unknown" if left else "0 s"
    rec = load_json(cell.result_file)
    d = cell.dataset
    return (f"cell {cell.index + 1}/{len(plan.cells)} done: {cell.label}, {d.metric_name} {rec['scores'][d.metric]:.2f}"
            f" | {len(finished)}/{len(plan.cells)} cells, ETA {eta}")


def require_available(cells: list[Cell]) -> None:
    """``--strict``: a missing cell is an error (exit 2) before anything runs."""
    missing = [c for c in cells if c.missing]
    if missing:
        raise ConfigError([f"--strict: cell {c.index} {c.label}: missing: {c.missing}" for c in missing])


def run_cells(plan: Plan, launcher: Launcher, only: int | None = None, strict: bool = False) -> int:
    """Run the plan's cells (or only cell ``only``); exit status: 0 all done or missing, 1 a cell failed,
    75 stopped by a signal (rerun to continue)."""
    if only is not None and not 0 <= only < len(plan.cells):
        raise ConfigError(f"--cell {only}: the suite has cells 0-{len(plan.cells) - 1} (see --dry-run)")
    cells = plan.cells if only is None else [plan.cells[only]]
    todo = [c for c in cells if not done(c) and not c.missing]
    if todo:
        launcher.prepare()
    t0, failed, status = time.monotonic(), 0, "complete"
    stop = StopRequest()
    try:
        for cell in cells:
            if done(cell):
                continue
            if cell.missing:
                log.warning("cell %d/%d missing: %s: %s", cell.index + 1, len(plan.cells), cell.label, cell.missing)
                continue
            if cell.after is not None and not done(cell.after):
                log.error("cell %d/%d blocked: %s continues from %s (cell %d), which has not finished",
                          cell.index + 1, len(plan.cells), cell.label, cell.after.label, cell.after.index)
                failed += 1
                continue
            with exclusive_lock(cell.dir / "cell.lock", f"benchmark cell {cell.label}"):
                outcome = "done" if done(cell) else _run_cell(cell, plan, launcher, stop)
            if outcome == "done":
                log.info("%s", _progress(cell, plan))
            failed += outcome == "failed"
            if outcome == "interrupted" or stop.signum is not None:
                status = "interrupted"
                break
            if outcome == "failed" and strict:
                break
    finally:
        stop.restore()
    _summary(plan, cells, only, failed, status, time.monotonic() - t0)
    return EX_INTERRUPTED if status == "interrupted" else 1 if failed else 0


def _summary(plan: Plan, cells: list[Cell], only: int | None, failed: int, status: str, seconds: float) -> None:
    n_done = sum(done(c) for c in cells)
    n_missing = sum(bool(c.missing) for c in cells)
    where = ""
    if only is None:
        res = write_report(plan.out)
        score = res.get("blurb_score") if res.get("blurb_score") is not None else res.get("blurb_score_partial")
        where = (f"; BLURB score {score:.2f}{'' if res.get('blurb_score') is not None else ' (partial)'}"
                 if plan.suite.blurb_score and score is not None else "") + f"; tables: {plan.out / 'results.md'}"
    what = f"cell {only}" if only is not None else f"benchmark {plan.suite.name}"
    log.info("%s %s: %d/%d cells done, %d missing, %d failed in %s%s", what, status, n_done, len(cells),
             n_missing, failed, _duration(seconds), where)
    if status == "interrupted":
        log.info("stopped by a signal: rerun the same command to continue (finished cells are kept)")
