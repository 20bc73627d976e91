"""``bio-megatron evaluate {pubmedqa,bioasq_yesno,ddi,gad,biosses,hoc,ebm_pico,jnlpba} --gold G --pred P``.

``evaluate hoc --metric blue`` scores HoC with BLUE's abstract-level F instead (evaluation/hoc_blue.py).

Each command reads the gold file with its BLURB reader, the predictions checked against it, and prints
one JSON object: ``task``, ``metric``, ``score`` (BLURB's headline, 0-1 scale) and the details
(``--json OUT`` also writes it). Definitions: docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse

from bio_megatron.tasks.blurb_scoring import EVALUATORS, METRIC_VARIANTS


def register(ev: argparse._SubParsersAction) -> None:
    """Add one ``evaluate`` sub-command per BLURB task."""
    for name, task in _evaluators().items():
        p = ev.add_parser(name, help=task.help, description=f"{task.help}. Prints one JSON object.")
        p.add_argument("--gold", required=True, help=task.gold)
        p.add_argument("--pred", required=True, help=f"predictions: {task.pred}")
        p.add_argument("--json", dest="json_out", metavar="OUT", help="also write the JSON object to OUT")
        if task.label_map:
            p.add_argument("--label-map", metavar="FILE",
                           help="the model's label_ids.csv (one label per line, id = line number from 0): integer "
                                "label ids in --pred are read through it; without it only label names are accepted")
        if name == "hoc":
            p.add_argument("--metric", choices=("blurb", "blue"), default="blurb",
                           help="blurb: BLURB's micro F1 over abstract x hallmark cells (default); blue: BLUE's "
                                "abstract-level F (harmonic mean of the mean per-abstract precision and recall), "
                                "the HoC score bio-lm reports")
        p.set_defaults(func=run, blurb_task=name)


def run(args: argparse.Namespace) -> int:
    from bio_megatron.cli.output import emit
    from bio_megatron.evaluation.blurb import as_dict, report_text
    from bio_megatron.utils.io import check_output_file, write_json_atomic
    from bio_megatron.utils.log import get_logger

    if args.json_out:
        check_output_file(args.json_out)  # before reading: a bad --json path should not cost the scoring
    task = _evaluators()[args.blurb_task]
    label_map = getattr(args, "label_map", None)
    score = task.score
    if getattr(args, "metric", "blurb") == "blue":
        score = METRIC_VARIANTS[(args.blurb_task, "blue")]
    if label_map:
        result = score(args.gold, args.pred, _label_map(label_map, args.blurb_task))
    else:
        result = score(args.gold, args.pred)
    get_logger("cli").info("%s", report_text(result, args.blurb_task))
    obj = as_dict(result, args.blurb_task)
    if args.json_out:
        write_json_atomic(args.json_out, obj)
    return emit(obj)


def _evaluators() -> dict:
    """BLURB's evaluators, then the clinical pair tasks' (``mednli``, ``clinicalsts``: tasks/clinical_data.py)."""
    from bio_megatron.tasks.clinical_data import EVALUATORS as CLINICAL

    return {**EVALUATORS, **CLINICAL}


def _label_map(path: str, task_name: str) -> dict[int, str]:
    """Label id -> name of a ``label_ids.csv``, each name one of the task's labels."""
    from bio_megatron.evaluation.blurb_predictions import check_label_map
    from bio_megatron.tasks.classify_data import dataset
    from bio_megatron.tasks.ner_data import read_label_ids

    id_to_label = {i: name for name, i in read_label_ids(path).items()}
    check_label_map(id_to_label, dataset(task_name).labels, path)
    return id_to_label
