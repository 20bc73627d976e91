"""``bio-megatron report RUN_DIR``: a run's curves as PNGs and an HTML page (docs/REPORTS.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bio_megatron.utils.errors import OutputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="plots of a pretraining or fine-tuning run (loss, LR, grad norm, evaluations, "
                                      "throughput) as PNGs and one HTML page",
                       description="Read a run folder's metrics.jsonl (or a fine-tuning run's results.json history) "
                                   "and write index.html with matplotlib PNGs beside it.")
    p.epilog = "exit codes: 0 written; 2 not a run folder, no records, or --out refused"
    p.add_argument("run_dir", help="the run folder (exp_manager.exp_dir/exp_manager.name, or a fine-tuning seed run)")
    p.add_argument("--out", help="report folder (default RUN_DIR/report)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report in --out")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from bio_megatron.report.run import write_run_report

    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "report"
    if os.path.realpath(out) == os.path.realpath(run_dir):
        raise OutputError(f"{out}: is the run folder itself; choose another --out")
    files = write_run_report(run_dir, out, args.overwrite)
    sys.stdout.write(f"{out / 'index.html'}: {len(files) - 1} plot(s)\n")
    return 0
