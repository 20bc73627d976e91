"""``bio-megatron evaluate {ner,re,squad,bioasq}`` and ``bioasq-submission``: official-equivalent scores as JSON.

Each command prints one JSON object on stdout. Metric definitions and which official scorer each one
equals: docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score predictions with the official NER/RE/SQuAD/BioASQ metrics",
                       description="Score predictions; prints one JSON object.")
    ev = p.add_subparsers(dest="evaluate_command", metavar="TASK", required=True)

    n = ev.add_parser("ner", help="entity-level P/R/F1 exactly as CoNLL's conlleval (percent)")
    n.add_argument("--input", required=True, help="conlleval format: 'token gold pred' per line, blank line "
                                                   "between sentences")
    n.set_defaults(func=run_ner)

    r = ev.add_parser("re", help="ChemProt micro P/R/F1 over CPR:3,4,5,6,9 (fractions, as scikit-learn)")
    r.add_argument("--gold", required=True, help="one label per line, or NeMo 'sentence<TAB>label' tsv")
    r.add_argument("--pred", required=True, help="one label per line (names or ids), same order as --gold")
    r.add_argument("--label-ids", help="label_ids.csv mapping integer ids to names "
                                       "(default: false, CPR:3, CPR:4, CPR:5, CPR:6, CPR:9)")
    r.set_defaults(func=run_re)

    s = ev.add_parser("squad", help="official SQuAD v1.1/v2.0 evaluation (percent)")
    s.add_argument("--data", required=True, help="SQuAD dev JSON")
    s.add_argument("--predictions", required=True, help="JSON object question id -> answer text")
    s.add_argument("--version", choices=["1.1", "2.0"], help="default: from the data file")
    s.add_argument("--na-prob-file", help="JSON question id -> no-answer probability (v2.0 only)")
    s.add_argument("--na-prob-thresh", type=float, default=1.0)
    s.set_defaults(func=run_squad)

    b = ev.add_parser("bioasq", help="BioASQ factoid strict/lenient accuracy and MRR (fractions)")
    b.add_argument("--golden", required=True, help="official BioASQ golden JSON")
    b.add_argument("--predictions", required=True, help="submission JSON ({'questions': [{'id', 'exact_answer'}]})")
    b.set_defaults(func=run_bioasq)

    bs = ev.add_parser("bioasq-submission", help="turn snippet n-best predictions into a BioASQ submission")
    bs.add_argument("--nbest", required=True, help="JSON snippet id -> [{'text', 'probability'}, ...]")
    bs.add_argument("--out", help="also write the submission here")
    bs.add_argument("--max-answers", type=int, default=5)
    bs.set_defaults(func=run_bioasq_submission)


def _emit(obj: dict) -> int:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _load(path: str):
    from bio_megatron.tasks.qa_data import load_json

    return load_json(path)


def run_ner(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.conlleval import evaluate_file

    return _emit(evaluate_file(args.input))


def run_re(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.chemprot import chemprot_scores, read_label_column
    from bio_megatron.tasks.ner_data import read_label_ids
    from bio_megatron.utils.errors import DataError

    mapping = None
    if args.label_ids:
        mapping = {i: label for label, i in read_label_ids(args.label_ids).items()}
    gold, pred = read_label_column(args.gold, mapping), read_label_column(args.pred, mapping)
    if len(gold) != len(pred):
        raise DataError(f"{len(gold)} gold labels ({args.gold}) but {len(pred)} predictions", args.pred)
    return _emit(chemprot_scores(gold, pred))


def run_squad(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.squad import evaluate
    from bio_megatron.utils.errors import DataError

    data, preds = _load(args.data), _load(args.predictions)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError('expected a SQuAD JSON object with a "data" list', args.data)
    if not isinstance(preds, dict):
        raise DataError("expected a JSON object question id -> answer text", args.predictions)
    na_probs = _load(args.na_prob_file) if args.na_prob_file else None
    return _emit(evaluate(data, preds, args.version, na_probs, args.na_prob_thresh))


def run_bioasq(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.bioasq import factoid_scores, golden_factoids, submission_answers

    golden = golden_factoids(_load(args.golden), args.golden)
    system = submission_answers(_load(args.predictions), args.predictions)
    return _emit(factoid_scores(golden, system))


def run_bioasq_submission(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.bioasq import build_submission
    from bio_megatron.utils.errors import DataError
    from bio_megatron.utils.io import write_json_atomic

    nbest = _load(args.nbest)
    if not isinstance(nbest, dict):
        raise DataError("expected a JSON object snippet id -> n-best list", args.nbest)
    submission = build_submission(nbest, max_answers=args.max_answers)
    if args.out:
        write_json_atomic(args.out, submission)
    return _emit(submission)
