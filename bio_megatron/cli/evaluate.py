"""``bio-megatron evaluate {ner,re,squad,bioasq}`` and ``bioasq-submission``: official-equivalent scores as JSON.

Each command prints one JSON object on stdout. Metric definitions and which official scorer each one
equals: docs/EVALUATION.md. BLURB's other tasks (``pubmedqa``, ``hoc``, ...) are in ``evaluate_blurb``.
"""

from __future__ import annotations

import argparse

from bio_megatron.cli.evaluate_blurb import register as register_blurb
from bio_megatron.cli.output import emit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score predictions with the official NER/RE/SQuAD/BioASQ/BLURB metrics",
                       description="Score predictions; prints one JSON object.")
    ev = p.add_subparsers(dest="evaluate_command", metavar="TASK", required=True)

    n = ev.add_parser("ner", help="entity-level P/R/F1 exactly as CoNLL's conlleval (percent)")
    n.add_argument("--input", required=True, help="conlleval format: 'token gold pred' per line, blank line "
                                                   "between sentences")
    n.set_defaults(func=run_ner)

    r = ev.add_parser("re", help="relation extraction micro P/R/F1 over the positive classes (fractions, as "
                                 "scikit-learn): ChemProt's CPR:3,4,5,6,9 or i2b2 2010's eight types")
    r.add_argument("--dataset", choices=["chemprot", "i2b2_2010"], default="chemprot",
                   help="whose labels and positives: chemprot (default; 'false' and CPR groups 1, 2, 7, 8, 10 are "
                        "negatives) or i2b2_2010 (BLUE: PIP, TeCP, TeRP, TrAP, TrCP, TrIP, TrNAP, TrWP; 'false' "
                        "excluded)")
    r.add_argument("--gold", required=True, help="one label per line, or NeMo 'sentence<TAB>label' tsv; with "
                                                 "--dataset i2b2_2010 also BLUE's 'index<TAB>sentence<TAB>label' TSV")
    r.add_argument("--pred", required=True, help="one label per line (gold label names, or integer ids with "
                                                  "--label-ids) or `predict re`'s JSON lines, same order as --gold")
    r.add_argument("--label-ids", "--label-map", dest="label_ids", metavar="FILE",
                   help="the model's label_ids.csv mapping integer ids to names: needed for integer ids in --pred "
                        "(a gold NeMo tsv's ids default to the dataset's labels in order: false first)")
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

    register_blurb(ev)


def _load(path: str, expected: str) -> object:
    from bio_megatron.evaluation.inputs import load_json

    return load_json(path, expected)


def run_ner(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.conlleval import evaluate_file

    return emit(evaluate_file(args.input))


def run_re(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.chemprot import chemprot_scores, read_label_column
    from bio_megatron.tasks.i2b2_relations import HEADER, read_i2b2_relations
    from bio_megatron.tasks.ner_data import read_label_ids
    from bio_megatron.tasks.re import label_set
    from bio_megatron.utils.errors import DataError

    labels, positives = label_set(args.dataset)
    mapping = None
    if args.label_ids:
        mapping = {i: label for label, i in read_label_ids(args.label_ids).items()}
        if other := sorted(set(mapping.values()) - set(labels)):  # scored with the wrong positives: all zeros
            raise DataError(f"labels {other} are not --dataset {args.dataset}'s ({', '.join(labels)}); give the "
                            f"model's dataset with --dataset", args.label_ids)
    if args.dataset == "i2b2_2010" and _first_line(args.gold).split("\t") == HEADER:  # BLUE's own TSV
        gold = [e.label for e in read_i2b2_relations(args.gold)]
    else:  # ChemProt's groups other than the five scored (CPR:1, ...) are negatives; i2b2 2010 has only its labels
        gold = read_label_column(args.gold, mapping or dict(enumerate(labels)),
                                 names=None if args.dataset == "chemprot" else labels)
    # a prediction is a name of the label set or a gold label; an integer id only through the model's map
    names = set(mapping.values() if mapping else labels) | set(gold)
    pred = read_label_column(args.pred, mapping, names=names, ids=mapping is not None)
    if len(gold) != len(pred):
        raise DataError(f"{len(gold)} gold labels ({args.gold}) but {len(pred)} predictions", args.pred)
    return emit(chemprot_scores(gold, pred, positives))


def _first_line(path: str) -> str:
    """The first non-blank line: BLUE's header tells its TSV from a label column."""
    from bio_megatron.evaluation.inputs import iter_lines

    lines = iter_lines(path, "BLUE's i2b2 2010 relation TSV or one label per line")
    try:
        return next((line for _, line in lines if line.strip()), "")
    finally:
        lines.close()


def run_squad(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.squad import check_dataset, check_na_probs, evaluate
    from bio_megatron.utils.errors import ConfigError

    data = _load(args.data, "a SQuAD JSON object with a \"data\" list")
    preds = _load(args.predictions, "a JSON object question id -> answer text")
    na_probs = None
    if args.na_prob_file:
        if args.version == "1.1":
            raise ConfigError("--na-prob-file applies to SQuAD v2.0 only (--version 1.1 given)")
        na_probs = _load(args.na_prob_file, "a JSON object question id -> no-answer probability")
        check_na_probs(na_probs, check_dataset(data, args.data), args.na_prob_file)
    return emit(evaluate(data, preds, args.version, na_probs, args.na_prob_thresh,
                          data_path=args.data, predictions_path=args.predictions))


def run_bioasq(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.bioasq import check_submission_ids, factoid_scores, golden_factoids, \
        submission_answers

    golden_json = _load(args.golden, "an official BioASQ golden JSON object with a \"questions\" list")
    golden = golden_factoids(golden_json, args.golden)
    system = submission_answers(_load(args.predictions, 'a BioASQ submission JSON object with a "questions" list'),
                                args.predictions)
    check_submission_ids(golden_json, golden, system, args.golden, args.predictions)
    return emit(factoid_scores(golden, system))


def run_bioasq_submission(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.bioasq import build_submission
    from bio_megatron.evaluation.inputs import first_few
    from bio_megatron.utils.errors import ConfigError, DataError
    from bio_megatron.utils.io import write_json_atomic

    if args.max_answers < 1:
        raise ConfigError(f"--max-answers must be at least 1, got {args.max_answers}")
    nbest = _load(args.nbest, "a JSON object snippet id -> n-best list")
    if not isinstance(nbest, dict) or not nbest:
        raise DataError("expected a non-empty JSON object snippet id -> n-best list", args.nbest)
    bad = [k for k, v in nbest.items() if not isinstance(v, list)]
    if bad:
        raise DataError(f"the n-best of {first_few(bad)} is not a list of {{'text', 'probability'}} objects",
                        args.nbest)
    try:
        submission = build_submission(nbest, max_answers=args.max_answers)
    except DataError as exc:
        if exc.path is None:  # the pooling step does not know the file: name it
            raise DataError(str(exc), args.nbest) from None
        raise
    if args.out:
        write_json_atomic(args.out, submission)
    return emit(submission)
