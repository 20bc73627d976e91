"""``bio-megatron finetune {ner,re,qa,classify} --config RECIPE key=value ... [--seeds 10,42,1234]
[--grid | --grid key=v1,v2 ...]``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bio_megatron.cli.dry_run import SKIP_HELP
from bio_megatron.utils.errors import ConfigError

NEMO_FILES = {"ner": "token_classification_config.yaml", "re": "text_classification_config.yaml", "qa": "qa_conf.yaml"}


def parse_seeds(text: str | None, flag: str = "--seeds") -> list[int] | None:
    """``10,42,1234`` -> [10, 42, 1234] (None when not given). A repeated seed is refused: each seed is one run
    folder, and the same run counted twice would weigh in the mean twice."""
    if not text:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers, e.g. 10,42,1234") from None
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{flag} {text!r}: a seed is given twice (each seed is one run folder)")
    return seeds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune on NER, relation extraction, QA or BLURB classification "
                                        "(single process, torchrun, srun)",
                       description="Fine-tune from a BioMegatron checkpoint (any TP/PP layout) or an HF MegatronBert "
                                   "folder with a NeMo-style recipe and key=value overrides; prints results as JSON.")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    for task, what in (("ner", "named-entity recognition (conlleval entity F1)"),
                       ("re", "relation extraction, ChemProt (micro-F1 over CPR:3/4/5/6/9)"),
                       ("qa", "extractive QA: SQuAD v1.1/v2.0, BioASQ factoid"),
                       ("classify", "BLURB sentence(-pair) classification, regression, multi-label: PubMedQA, "
                                    "BioASQ yes/no, DDI, GAD, BIOSSES, HoC (model.dataset.task_name)")):
        t = tasks.add_parser(task, help=what)
        t.epilog = ("exit codes: 0 finished (results.json written); 2 bad configuration or input, or the experiment "
                    "directory is in use by another run; 3 stopped because the loss or gradients stayed NaN/Inf "
                    "(no results.json)")
        nemo = (f", or NeMo's {NEMO_FILES[task]} as it is (its keys are mapped; docs/INTERCHANGE.md)"
                if task in NEMO_FILES else " (NeMo's text_classification keys are read; the data is BLURB's own files)")
        t.add_argument("--config", required=True, help=f"recipe, e.g. nemo_configs/{task}/... (or its name){nemo}")
        t.add_argument("overrides", nargs="*", help="key=value, e.g. model.restore_from_path=runs/x/checkpoints")
        t.add_argument("--seeds", help="comma-separated seeds: one run each, then mean/median/spread")
        t.add_argument("--grid", action="append", nargs="?", const="", metavar="KEY=V1,V2",
                       help="a grid over any config key, e.g. --grid model.optim.lr=1e-5,2e-5 --grid "
                       "trainer.max_epochs=3,5 (repeatable: the cartesian product), selected on the mean dev metric "
                       "over the seeds; bare --grid (after the overrides): the recipe's head grid "
                       "grid.num_fc_layers x grid.fc_hidden_size")
        t.add_argument("--folds", metavar="1-10",
                       help="k-fold cross-validation over model.dataset.fold (GAD/EU-ADR, bio-lm's protocol): tune "
                       "(--grid) on the first fold, run the choice on the others, report the median of their test "
                       "scores (benchmark/kfold.py)")
        t.add_argument("--dry-run", action="store_true",
                       help="pre-flight: check every path the run reads (data files, vocabulary, restore source), "
                       "read the source and the train/dev data as the run would, print the resolved config, "
                       "effective shape, parameter count, memory per rank, steps and epochs, and exit (every "
                       "problem at once, exit 2)")
        t.add_argument("--skip-path-checks", action="store_true", help=SKIP_HELP)
        t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.config.recipes import find_recipe
    from bio_megatron.parallel.distributed import resolve_world
    from bio_megatron.parallel.seam import import_megatron_core

    import_megatron_core()  # before anything imports megatron-core: 1-2 s less start-up (parallel/lean_import.py says why)
    world = resolve_world()
    seeds = parse_seeds(args.seeds)
    recipe = find_recipe(args.task, args.config)
    size = None if args.dry_run else world.world_size
    cfg = load_finetune_config(args.task, recipe, args.overrides, size)
    head_grid, specs = "" in (args.grid or []), [g for g in args.grid or [] if g]
    if head_grid and specs:
        raise ConfigError("--grid: either bare (the recipe's head grid) or key=v1,v2 flags, not both (put "
                          "model.fc_hidden_size / the head's layer count in key=v1,v2 flags instead)")
    folds = None
    if args.folds:
        from bio_megatron.benchmark.kfold import check_fold_key, parse_folds

        folds = parse_folds(args.folds)
        check_fold_key(cfg)
    points = None
    if specs and not folds:  # with --folds the grid is built on the tuning fold
        from bio_megatron.tasks.grid import grid_points

        points = grid_points(args.task, recipe, args.overrides, specs, size)
    if args.dry_run:
        from bio_megatron.cli.dry_run import finetune_report

        print(json.dumps(finetune_report(cfg, world.world_size, not args.skip_path_checks), indent=2))
        return 0
    from bio_megatron.parallel.distributed import teardown
    from bio_megatron.tasks.sweep import run_sweep
    from bio_megatron.training.guards import check_sweep_dir, mark_sweep_dir

    sweep_dir = Path(cfg.exp_manager.exp_dir) / cfg.exp_manager.name  # results.json/md and a folder per seed
    check_sweep_dir(sweep_dir)  # every rank alike, before any of them starts
    try:
        if folds:
            from bio_megatron.benchmark.kfold import cross_validate

            summary = cross_validate(args.task, recipe, args.overrides, folds, seeds, head_grid, specs, size)
        else:
            summary = run_sweep(cfg, seeds, head_grid, points)
    finally:
        if world.rank == 0:
            mark_sweep_dir(sweep_dir)
        teardown()
    if world.rank == 0:
        print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    return 0
