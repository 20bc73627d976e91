"""``bio-megatron benchmark {blurb,paper} --model M ...`` and ``benchmark report DIR`` (docs/BENCHMARK_SUITES.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from bio_megatron.cli.finetune import parse_seeds
from bio_megatron.utils.errors import ConfigError

_LAUNCH_HELP = ("local: each cell's `bio-megatron finetune` in a child process of this one (one process: CPU or "
                "one GPU); torchrun: torchrun --standalone on this host; srun: inside a SLURM allocation, on all its "
                "nodes; slurm: submit one array task per cell (slurm/benchmark.sbatch) and a report job")


def register(sub: argparse._SubParsersAction) -> None:
    from bio_megatron.benchmark.launch import LAUNCHERS
    from bio_megatron.benchmark.plan import DEFAULT_SAMPLE_SEED

    p = sub.add_parser("benchmark", help="whole benchmark suites (BLURB; the paper's Tables 1-2): every dataset x "
                                         "seed, resumable, with the publications' tables",
                       description="Fine-tune and score a model on every dataset x seed of a suite, resumably; "
                                   "writes results.json and results.md in the publication's layout.")
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name, what in (("blurb", "BLURB: 13 datasets, 6 task types, the BLURB score"),
                       ("paper", "BioMegatron's Tables 1-2: BC5CDR-chem/-disease, NCBI-disease, ChemProt (P/R/F1); "
                                 "SQuAD v1.1 -> BioASQ-7b factoid (SAcc/LAcc/MRR)"),
                       ("biolm", "bio-lm's 18 tasks (Lewis et al. 2020, Table 1 order) with its protocol: 5 seeds, "
                                 "the median, GAD/EU-ADR by 10-fold cross-validation, its Tables 3-4 group means"),
                       ("blue-clinical", "BioELECTRA's four clinical tasks: MedNLI, i2b2-2010 relations, ShARe/CLEFE, "
                                         "ClinicalSTS")):
        s = suites.add_parser(name, help=what, description=what)
        s.epilog = ("exit codes: 0 every cell done or missing; 1 a cell failed (the others ran); 2 bad input or "
                    "another suite runs in --out; 75 stopped by SIGTERM/SIGUSR1 (rerun to continue)")
        s.add_argument("--model", required=True, help="our checkpoint (or run / checkpoints folder), a Hugging Face "
                                                       "folder, a .nemo file or a Megatron-LM checkpoint")
        s.add_argument("--out", help="suite folder (default runs/benchmark/<suite>-<model name>)")
        s.add_argument("--datasets", help="comma-separated subset (--dry-run lists them); prerequisites are added")
        s.add_argument("--seeds", help="comma-separated seeds, every dataset runs each (default: the publications' "
                                        "runs per dataset, docs/BENCHMARK_SUITES.md)")
        s.add_argument("--grid", action=argparse.BooleanOptionalAction, default=None,
                       help="sweep the recipes' head grid and keep the best mean dev point "
                            f"(default: {'on' if name == 'paper' else 'off'})")
        s.add_argument("--max-examples", type=int, help="cut train/dev/test to N examples drawn at random, "
                                                         "stratified by label for classification (smoke runs)")
        s.add_argument("--sample-seed", type=int, default=DEFAULT_SAMPLE_SEED,
                       help=f"seed of the --max-examples sample (default {DEFAULT_SAMPLE_SEED}; recorded in the "
                            "suite's manifest and results)")
        s.add_argument("--epochs", type=int, help="trainer.max_epochs for every cell (smoke runs)")
        s.add_argument("--recipe-map", help="YAML: dataset -> {recipe, overrides} replacing the suite's recipe")
        s.add_argument("--launcher", choices=LAUNCHERS, default="local", help=_LAUNCH_HELP)
        s.add_argument("--nproc-per-node", type=int, default=int(os.environ.get("GPUS_PER_NODE") or 1),
                       help="processes per node for torchrun / srun (default $GPUS_PER_NODE or 1)")
        s.add_argument("--cell", type=int, help="run only this cell (an index from --dry-run; SLURM array tasks)")
        s.add_argument("--sbatch-args", default="", help='--launcher slurm: extra sbatch options, e.g. '
                                                         '"--account=A --partition=P"')
        s.add_argument("--strict", action="store_true", help="fail (exit 2) when a cell is missing")
        s.add_argument("--overwrite", action="store_true",
                       help="remove the earlier suite in --out (other options are refused without it) and start over")
        s.add_argument("--dry-run", action="store_true", help="print the cells and their commands, then exit")
        s.add_argument("overrides", nargs="*", help="key=value for every cell, e.g. model.micro_batch_size=16")
        s.set_defaults(func=run_suite)
    r = suites.add_parser("report", help="rebuild results.json, results.md, results.csv, results.tex and plots/ "
                                         "from a suite folder's cells")
    r.add_argument("dir", help="the suite folder")
    r.add_argument("--name", help="the model's display name in the tables and plots (default: its folder's name)")
    r.set_defaults(func=run_report)


def _check(args: argparse.Namespace) -> None:
    problems = [f"--{k.replace('_', '-')} ({getattr(args, k)}) must be >= 1" for k in
                ("max_examples", "epochs", "nproc_per_node") if getattr(args, k) is not None and getattr(args, k) < 1]
    if args.cell is not None and (args.launcher == "slurm" or args.overwrite):
        problems.append("--cell runs one cell here: not with --launcher slurm or --overwrite")
    if problems:
        raise ConfigError(problems)


def _suite_args(args: argparse.Namespace, opts, out: Path) -> list[str]:
    """The options that define the suite, as an array task passes them on (launch settings come from the job)."""
    # without --seeds (opts.runs set) the task takes the default seeds too: each dataset its publication's runs
    seeds = [] if opts.runs else ["--seeds", ",".join(map(str, opts.seeds))]
    a = [opts.suite, "--model", opts.model, "--out", str(out), "--datasets", ",".join(opts.datasets), *seeds,
         "--grid" if opts.grid else "--no-grid"]
    a += ["--max-examples", str(opts.max_examples), "--sample-seed", str(opts.sample_seed)] if opts.max_examples \
        else []
    a += ["--epochs", str(opts.epochs)] if opts.epochs else []
    a += ["--recipe-map", os.path.abspath(args.recipe_map)] if args.recipe_map else []
    return a + list(opts.overrides)


def run_suite(args: argparse.Namespace) -> int:
    from bio_megatron.benchmark.launch import EX_INTERRUPTED
    from bio_megatron.benchmark.steps import checkpoint_steps, step_folder, write_steps_report
    from bio_megatron.benchmark.suites import SUITES

    _check(args)
    suite = SUITES[args.suite]
    model = os.path.abspath(args.model)
    name = Path(model).name.removesuffix(".nemo") or "model"
    out = Path(os.path.abspath(args.out or f"runs/benchmark/{suite.name}-{name}"))
    steps = checkpoint_steps(Path(model))
    if len(steps) < 2:
        return _run_one(args, suite, model, out)
    # a pretraining run with several saved checkpoints: the suite once per checkpoint (the paper's Table 5)
    if args.cell is not None:
        raise ConfigError(f"--cell: {model} holds {len(steps)} checkpoints, each its own suite under "
                          f"{out / 'steps'}: give one checkpoint as --model and its folder as --out")
    if args.dry_run:
        sys.stdout.write(f"benchmark {suite.name}: {len(steps)} checkpoints of {model} (steps "
                         f"{', '.join(str(s) for s, _ in steps)}), one suite each under {out / 'steps'}\n")
    rc = 0
    for step, ckpt in steps:
        rc = max(rc, _run_one(args, suite, str(ckpt), step_folder(out, step)))
        if rc == EX_INTERRUPTED:
            return rc
    if not args.dry_run and args.launcher != "slurm":
        summary = write_steps_report(out)
        sys.stdout.write(f"scores against steps: {out / 'steps.md'}, plot {out / summary['plot']}\n")
    return rc


def _run_one(args: argparse.Namespace, suite, model: str, out: Path) -> int:
    """The suite for one model into one suite folder (the whole command, for one checkpoint)."""
    from bio_megatron.benchmark import slurm
    from bio_megatron.benchmark.folder import differences, model_kind, open_suite, restore_path
    from bio_megatron.benchmark.launch import Launcher
    from bio_megatron.benchmark.plan import Options, build_plan, load_recipe_map, select_datasets
    from bio_megatron.benchmark.run import done, require_available, run_cells
    from bio_megatron.utils.lock import exclusive_lock

    kind = model_kind(model)
    datasets = select_datasets(suite, args.datasets.split(",") if args.datasets else None)
    seeds = parse_seeds(args.seeds)  # given: every dataset runs them all; else each its publication's runs
    opts = Options(suite.name, model, datasets, tuple(seeds or suite.seeds),
                   suite.grid if args.grid is None else args.grid, args.max_examples, args.epochs,
                   tuple(args.overrides), load_recipe_map(args.recipe_map),
                   {} if seeds else suite.default_runs(datasets), args.sample_seed)
    plan = build_plan(opts, out, restore_path(out, model, kind))
    if args.cell is not None and not 0 <= args.cell < len(plan.cells):
        raise ConfigError(f"--cell {args.cell}: the suite has cells 0-{len(plan.cells) - 1} (see --dry-run)")
    from bio_megatron.cli import main

    launcher = Launcher("local" if args.launcher == "slurm" else args.launcher, args.nproc_per_node, entry=main)
    sbatch_args = shlex.split(args.sbatch_args)
    if args.dry_run:
        lines = [f"benchmark {suite.name}: {len(plan.cells)} cells, suite folder {out}, model {model} ({kind})"]
        for c in plan.cells:
            what = "done" if done(c) else f"missing: {c.missing}" if c.missing else \
                shlex.join(launcher.command(c.finetune_args()))
            lines.append(f"[{c.index}] {c.label}: {what}")
        n_done, n_missing = sum(done(c) for c in plan.cells), sum(bool(c.missing) for c in plan.cells)
        lines.append(f"{len(plan.cells) - n_done - n_missing} to run, {n_done} done, {n_missing} missing")
        lines += slurm.describe(plan, _suite_args(args, opts, out), sbatch_args)
        diffs = differences(out, plan, kind)
        if diffs:
            lines.append(f"note: {out} holds a suite with other settings ({'; '.join(diffs)}): running needs "
                         "--overwrite (which starts over) or another --out")
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    if args.strict:
        require_available(plan.cells if args.cell is None else plan.cells[args.cell:args.cell + 1])
    if args.launcher == "slurm":
        with exclusive_lock(out / "suite.lock", f"benchmark suite folder {out}"):
            open_suite(plan, kind, args.overwrite)
            ids = slurm.submit(plan, _suite_args(args, opts, out), sbatch_args)
        sys.stdout.write(f"submitted: {' '.join(ids)}; the tables will be in {out / 'results.md'}\n")
        return 0
    if args.cell is not None:
        open_suite(plan, kind, False)
        return run_cells(plan, launcher, args.cell, args.strict)
    with exclusive_lock(out / "suite.lock", f"benchmark suite folder {out}"):
        open_suite(plan, kind, args.overwrite)
        return run_cells(plan, launcher, None, args.strict)


def run_report(args: argparse.Namespace) -> int:
    from bio_megatron.benchmark.report import MANIFEST, write_report
    from bio_megatron.benchmark.steps import STEPS, write_steps_report

    out = Path(args.dir)
    if not (out / MANIFEST).is_file() and (out / STEPS).is_dir():  # a suite per pretraining checkpoint
        summary = write_steps_report(out, name=args.name)
        sys.stdout.write(f"{out / 'steps.json'}, {out / 'steps.md'}, {out / 'steps.png'}: "
                         f"{len(summary['steps'])} checkpoint(s)\n")
        return 0
    res = write_report(out, name=args.name)
    score = res.get("blurb_score")
    files = ", ".join(str(out / f"results.{ext}") for ext in ("json", "md", "csv", "tex"))
    sys.stdout.write(f"{files}: {res['cells_finished']}/{res['cells_total']} cells finished"
                     + (f", BLURB score {score:.2f}" if score is not None else "")
                     + (f"; {len(res['plots'])} plot(s) in {out / 'plots'}" if res.get("plots") else "") + "\n")
    return 0
