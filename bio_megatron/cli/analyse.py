"""``bio-megatron analyse``: dataset analyses.

``label-bias {ner,re,qa} FILE...`` is the paper's Table 8 statistic (:mod:`bio_megatron.evaluation.label_bias`);
``mention-overlap`` is how much of an NER test split is memorisable from training
(:mod:`bio_megatron.evaluation.mention_overlap`). Both print one JSON object.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bio_megatron.cli.output import emit
from bio_megatron.tasks.re_data import RELATION_FORMATS, read_relations


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyse", help="dataset analyses (label bias, mention overlap)")
    an = p.add_subparsers(dest="analyse_command", metavar="ANALYSIS", required=True)

    lb = an.add_parser("label-bias", help="label bias of NER/RE/QA datasets (paper Table 8)",
                       description="Table 8 of the BioMegatron paper: minority/majority label samples for NER "
                                   "and RE, min/max repeat of the same question-answer for QA. Prints one JSON "
                                   "object (or the table with --format markdown).")
    lb.add_argument("task", choices=["ner", "re", "qa"])
    lb.add_argument("files", nargs="+", metavar="FILE",
                    help="ner: IOB 'token<TAB>tag' files; re: NeMo tsv, SciBERT JSON lines or an original "
                         "ChemProt split directory; qa: SQuAD-format JSON (SQuAD, BioASQ)")
    lb.add_argument("--vocab", help="ner: count sub-tokens of this vocab.txt instead of words")
    lb.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                    help="with --vocab: lower-case words first (default: guessed from the vocabulary)")
    lb.add_argument("--ignore-extra-tokens", action="store_true",
                    help="with --vocab: only a word's first sub-token is labelled (NeMo's scheme name)")
    lb.add_argument("--re-format", default="auto", choices=["auto", *RELATION_FORMATS])
    lb.add_argument("--format", default="json", choices=["json", "markdown"])
    lb.set_defaults(func=run_label_bias)

    mo = an.add_parser("mention-overlap", help="share of evaluation entity mentions already labelled in training",
                       description="Share of evaluation entity mentions whose string is labelled with the same "
                                   "type in training (memorisation); prints one JSON object.")
    mo.add_argument("--train", required=True, help="training IOB file (token<TAB>tag)")
    mo.add_argument("--eval", required=True, nargs="+", help="evaluation IOB file(s), e.g. devel.tsv test.tsv")
    mo.set_defaults(func=run_mention_overlap)


# What each reader expects, for the errors: a file with nothing to count names its format.
_EXPECTED = {"ner": "IOB 'token<TAB>tag' lines", "re": "ChemProt examples (NeMo tsv, SciBERT JSON lines or an "
             "original split directory)", "qa": "SQuAD-format JSON with answered questions"}


def _stats(task: str, path: str, args: argparse.Namespace, tokenizer) -> dict:
    from bio_megatron.evaluation import label_bias as lb
    from bio_megatron.evaluation.inputs import check_text_file
    from bio_megatron.utils.errors import DataError

    if not Path(path).is_dir():  # a directory is an original ChemProt split; its reader checks its files
        check_text_file(path, _EXPECTED[task])
    try:
        if task == "ner":
            from bio_megatron.tasks.ner_data import read_iob
            return lb.ner_label_bias(read_iob(path), tokenizer, args.ignore_extra_tokens)
        if task == "re":
            return lb.classification_label_bias(ex.label for ex in read_relations(path, args.re_format))
        from bio_megatron.tasks.qa_data import read_squad
        return lb.qa_label_bias(read_squad(path))
    except DataError as exc:
        if exc.path is None:  # the statistic found nothing to count: say which file and what it should hold
            raise DataError(f"{exc}; expected {_EXPECTED[task]}", path) from None
        raise


def run_label_bias(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.label_bias import DEFINITION, markdown_table
    from bio_megatron.utils.errors import ConfigError

    if args.task != "ner" and (args.vocab or args.ignore_extra_tokens):
        raise ConfigError("--vocab and --ignore-extra-tokens apply to 'ner' only")
    if args.ignore_extra_tokens and not args.vocab:
        raise ConfigError("--ignore-extra-tokens needs --vocab (per-word counts have one label per word anyway)")
    tokenizer = None
    if args.vocab:
        from bio_megatron.vocab.wordpiece import WordPieceTokenizer
        tokenizer = WordPieceTokenizer(args.vocab, lowercase=args.lowercase)
    results = {path: _stats(args.task, path, args, tokenizer) for path in args.files}
    if args.format == "markdown":
        return emit(markdown_table([(args.task.upper(), path, r) for path, r in results.items()]))
    out = {"task": args.task, "definition": DEFINITION[args.task], "files": results}
    if tokenizer is not None:
        out["vocab"] = args.vocab
    return emit(out)


def _iob_sentences(path: str) -> list[tuple[list[str], list[str]]]:
    from bio_megatron.evaluation.inputs import check_text_file
    from bio_megatron.tasks.ner_data import read_iob
    from bio_megatron.utils.errors import DataError

    check_text_file(path, _EXPECTED["ner"])
    sentences = [(s.words, s.tags) for s in read_iob(path)]
    if not sentences:
        raise DataError(f"no sentences; expected {_EXPECTED['ner']}", path)
    return sentences


def run_mention_overlap(args: argparse.Namespace) -> int:
    from bio_megatron.evaluation.mention_overlap import mention_overlap
    from bio_megatron.utils.errors import DataError

    train = _iob_sentences(args.train)
    out = {"train": args.train, "eval": {}}
    for path in args.eval:
        result = mention_overlap(train, _iob_sentences(path))
        # an overlap of 0 mentions (or against 0 training mentions) is 0% of nothing, not a finding
        if not result["train_mentions"]:
            raise DataError("no entity mention (B-/I- tag) in the training file; nothing to overlap with",
                            args.train)
        if not result["overall"]["mentions"]:
            raise DataError("no entity mention (B-/I- tag) in the evaluation file; nothing to measure", path)
        out["eval"][path] = result
    return emit(out)
