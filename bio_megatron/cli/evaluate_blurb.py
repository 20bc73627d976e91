"""``bio-megatron evaluate {pubmedqa,bioasq_yesno,ddi,gad,biosses,hoc,ebm_pico,jnlpba} --gold G --pred P``.

Each command reads the gold file with its BLURB reader, the predictions checked against it, and prints
one JSON object: ``task``, ``metric``, ``score`` (BLURB's headline, 0-1 scale) and the details
(``--json OUT`` also writes it). Definitions: docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse

from bio_megatron.tasks.blurb_scoring import EVALUATORS


def register(ev: argparse._SubParsersAction) -> None:
    """Add one ``evaluate`` sub-command per BLURB task."""
    for name, task in EVALUATORS.items():
        p = ev.add_parser(name, help=task.help, description=f"{task.help}. Prints one JSON object.")
        p.add_argument("--gold", required=True, help=task.gold)
        p.add_argument("--pred", required=True, help=f"predictions: {task.pred}")
        p.add_argument("--json", dest="json_out", metavar="OUT", help="also write the JSON object to OUT")
        p.set_defaults(func=run, blurb_task=name)


def run(args: argparse.Namespace) -> int:
    from bio_megatron.cli.evaluate import emit
    from bio_megatron.evaluation.blurb import as_dict, report_text
    from bio_megatron.utils.io import check_output_file, write_json_atomic
    from bio_megatron.utils.log import get_logger

    if args.json_out:
        check_output_file(args.json_out)  # before reading: a bad --json path should not cost the scoring
    result = EVALUATORS[args.blurb_task].score(args.gold, args.pred)
    get_logger("cli").info("%s", report_text(result, args.blurb_task))
    obj = as_dict(result, args.blurb_task)
    if args.json_out:
        write_json_atomic(args.json_out, obj)
    return emit(obj)
