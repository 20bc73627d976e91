"""``bio-megatron pretrain`` and ``bio-megatron demo``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bio_megatron.cli.dry_run import SKIP_HELP
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
EXIT_CODES = ("exit codes: 0 finished, or interrupted by SIGTERM/SIGUSR1 after saving (status.json says which); "
              "2 bad configuration or input, or the run directory is in use by another run; 3 stopped because the "
              "loss or gradients stayed NaN/Inf for trainer.max_nonfinite_steps steps in a row (status.json "
              '"failed"; checkpoints/latest is the last finite checkpoint); 130 stopped by Ctrl-C after saving (status.json '
              '"interrupted"; a second Ctrl-C aborts without saving)')


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pretrain Megatron BERT (single process, torchrun or srun)",
                       description="Pretrain Megatron BERT from a NeMo-style recipe with key=value overrides.",
                       epilog=EXIT_CODES)
    p.add_argument("--config", required=True, help="recipe YAML, e.g. nemo_configs/pretrain/biomegatron_345m.yaml, or NeMo's own "
                   "megatron_bert_config.yaml as it is (its keys are mapped; docs/INTERCHANGE.md)")
    p.add_argument("overrides", nargs="*", help="key=value overrides (OmegaConf dotlist; +key=value adds, ~key deletes), "
                   "e.g. trainer.max_steps=100")
    p.add_argument("--dry-run", action="store_true",
                   help="pre-flight: check every path the run reads (corpus prefixes, vocabulary, restore "
                   "checkpoint), print the resolved config, effective shape, data, exact parameter count, memory "
                   "per rank and length of the run, and exit (every problem at once, exit 2)")
    p.add_argument("--skip-path-checks", action="store_true", help=SKIP_HELP)
    p.set_defaults(func=run_pretrain)

    d = sub.add_parser("demo", help="end-to-end demo on bundled real PubMed/PMC text (tiny model, CPU, TP=2)")
    d.add_argument("--out", default="runs/demo", help="where the corpus, run and checkpoints go")
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--nproc", type=int, default=2, help="processes (= tensor-parallel size)")
    d.set_defaults(func=run_demo)


def run_pretrain(args: argparse.Namespace) -> int:
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.recipes import find_recipe
    from bio_megatron.parallel.distributed import resolve_world
    from bio_megatron.parallel.seam import import_megatron_core

    import_megatron_core()  # before anything imports megatron-core: 1-2 s less start-up (parallel/lean_import.py)
    world = resolve_world()
    cfg = load_pretrain_config(find_recipe("pretrain", args.config), args.overrides,
                              None if args.dry_run else world.world_size)
    if args.dry_run:
        from bio_megatron.cli.dry_run import pretrain_report

        print(json.dumps(pretrain_report(cfg, world.world_size, not args.skip_path_checks), indent=2))
        return 0
    from bio_megatron.parallel.distributed import teardown
    from bio_megatron.training.pretrain import run_pretraining

    try:
        run_pretraining(cfg)
    finally:
        teardown()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from bio_megatron.demo import demo

    return demo(Path(args.out), args.steps, args.nproc)
