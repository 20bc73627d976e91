"""``bio-megatron predict ner`` / ``predict qa`` with a fine-tuned checkpoint (any saved layout) or HF folder;
``predict classify`` with a fine-tuned BLURB classification checkpoint; ``predict re`` with a ``finetune re`` one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from bio_megatron.utils.log import get_logger

log = get_logger()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="run a fine-tuned model on new text (NER entities, QA answers, BLURB classes, "
                                           "relations)")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    ner = tasks.add_parser("ner", help="entities with character offsets and a score (mean probability of the "
                                       "entity's word tags), one JSON line per document")
    ner.add_argument("--checkpoint", required=True, help="fine-tuned NER checkpoint or HF token-classification folder")
    ner.add_argument("--input", required=True, help="text.txt (one document per line) or docs.jsonl ({id, text})")
    ner.add_argument("--out", help="output JSON lines, streamed to <out>.partial window by window and renamed onto "
                     "--out when complete; a rerun after a kill continues there; default stdout (streamed, no resume)")
    ner.add_argument("--window", type=_positive, default=4096,
                     help="sentences tagged (and written) together, shortest first (default 4096)")
    ner.add_argument("--workers", type=_positive, default=1,
                     help="processes, each loading the model and taking whole windows; output stays in input order "
                     "(CPU: the torch threads are divided among them)")
    ner.add_argument("--overwrite", action="store_true",
                     help="start over, discarding an unfinished <out>.partial of other inputs")
    ner.set_defaults(func=run_ner)
    qa = tasks.add_parser("qa", help="answers to questions over given contexts")
    qa.add_argument("--checkpoint", required=True, help="fine-tuned QA checkpoint or HF question-answering folder")
    qa.add_argument("--input", required=True, help="SQuAD-format JSON or JSON lines ({id, question, context})")
    qa.add_argument("--out", help="predictions JSON (id -> answer); the n-best lists, each answer with its "
                    "probability, go beside it as *.nbest.json")
    qa.set_defaults(func=run_qa)
    cls = tasks.add_parser("classify", help="BLURB classification / similarity / hallmarks, JSON lines that "
                                            "`bio-megatron evaluate <task_name> --pred` reads, with the label "
                                            "probabilities (softmax; sigmoid per label for HoC)")
    cls.add_argument("--checkpoint", required=True, help="fine-tuned classify checkpoint (run dir, checkpoints/ ...)")
    cls.add_argument("--input", required=True, help="the dataset's own file (the checkpoint's task_name: GAD/DDI/HoC/"
                     "BIOSSES tsv, PubMedQA/BioASQ JSON) or JSON lines {id, text[, text_b]}")
    cls.add_argument("--out", help="output JSON lines (written atomically); default stdout")
    cls.set_defaults(func=run_classify)
    rel = tasks.add_parser("re", help="relation extraction (finetune re: ChemProt, i2b2 2010), JSON lines with the "
                                      "label and its probability that `bio-megatron evaluate re --pred` reads")
    rel.add_argument("--checkpoint", required=True, help="fine-tuned RE checkpoint (run dir, checkpoints/ ...) or "
                     "HF sequence-classification folder exported from one")
    rel.add_argument("--input", required=True, help="the dataset's own file (the checkpoint's model.dataset.format: "
                     "SciBERT JSON lines, the original ChemProt folder, NeMo tsv, BLUE's i2b2 2010 TSV) or JSON "
                     "lines {id, text} with the entity markers training used")
    rel.add_argument("--out", help="output JSON lines (written atomically); default stdout")
    rel.set_defaults(func=run_re)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _lean_start() -> None:
    """Import megatron-core the lean way (``parallel/lean_import.py``) before the loader imports it."""
    from bio_megatron.parallel.seam import import_megatron_core

    import_megatron_core()


def _load(path: str, task: str):
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process

    single_process()
    return load_finetuned(path, task)  # refuses a model of another task, naming both


def run_ner(args: argparse.Namespace) -> int:
    from bio_megatron.predict import stream

    stream.start_worker_server(args.workers)  # the workers' imports run beside ours, not after them
    _lean_start()
    from bio_megatron.formats.finetuned import finetuned_source
    from bio_megatron.parallel.distributed import teardown
    from bio_megatron.predict.ner import predict_window, read_documents, sentence_count
    from bio_megatron.utils.io import check_output_file, check_output_path

    state = None
    if args.out:  # a folder or an unwritable place is refused before the model loads, not after the work
        check_output_file(args.out)
        for path in stream.partial_paths(args.out):
            check_output_path(path, [args.input, args.checkpoint], "the unfinished output (--out)")
    # the whole input is read once first, nothing kept: a bad line is refused before the model loads
    total_docs, total_bytes = stream.scan(read_documents(args.input))
    finetuned_source(args.checkpoint, "ner")  # a model of another task is refused before anything is written
    docs = read_documents(args.input)
    progress = stream.Progress(total_docs, total_bytes)
    if args.out:
        identity = {"input": stream.input_identity(args.input), "checkpoint": stream.model_identity(args.checkpoint)}
        state = stream.new_state(identity)
        partial, _ = stream.partial_paths(args.out)
        if stream.resume_state(args.out, identity, args.overwrite):
            progress.docs, progress.done_bytes = stream.skip_done(partial, docs)
            progress.start_bytes = progress.done_bytes
            log.info("predict ner: continuing %s after %d of %d documents", partial, progress.docs, total_docs)
    try:
        loaded = None
        if args.workers == 1:
            loaded = _load(args.checkpoint, "ner")
        results = stream.stream_predictions(
            docs, window=args.window, workers=args.workers, checkpoint=args.checkpoint, batch_size=32,
            count=sentence_count, tag=lambda win: predict_window(loaded, win))
        stream.write_stream(results, progress, args.out, state)
    finally:
        teardown()
    return 0


def run_qa(args: argparse.Namespace) -> int:
    _lean_start()
    from bio_megatron.parallel.distributed import teardown
    from bio_megatron.predict.qa import answer, read_questions
    from bio_megatron.utils.io import check_output_file, write_json_atomic

    if args.out:
        out = Path(args.out)
        for path in (out, _nbest_path(out)):
            check_output_file(path)
    examples = read_questions(args.input)
    try:
        predictions, nbest = answer(_load(args.checkpoint, "qa"), examples)
    finally:
        teardown()
    if args.out:
        write_json_atomic(out, predictions)
        write_json_atomic(_nbest_path(out), nbest)
    else:
        print(json.dumps(predictions, indent=2))
    return 0


def run_classify(args: argparse.Namespace) -> int:
    _lean_start()
    from bio_megatron.predict.classify import dataset_config_of, load_classifier, predict, read_examples

    _check_out(args)
    examples = read_examples(args.input, dataset_config_of(args.checkpoint))  # the whole input, before the model loads
    return _predict_and_write(args, lambda: predict(load_classifier(args.checkpoint), examples))


def run_re(args: argparse.Namespace) -> int:
    _lean_start()
    from bio_megatron.predict.re import dataset_config_of, load_relation_model, predict, read_examples

    _check_out(args)
    examples = read_examples(args.input, dataset_config_of(args.checkpoint))  # the whole input, before the model loads
    return _predict_and_write(args, lambda: predict(load_relation_model(args.checkpoint), examples))


def _check_out(args: argparse.Namespace) -> None:
    """``--out`` is a file we may write, and not one of the inputs (before anything is read)."""
    from bio_megatron.utils.io import check_output_file, check_output_path

    if args.out:
        check_output_file(args.out)
        check_output_path(args.out, [args.input, args.checkpoint], "the predictions (--out)")


def _predict_and_write(args: argparse.Namespace, predictions: Callable[[], list[dict]]) -> int:
    """``predictions()`` in a one-process world (torn down after), written as JSON lines to ``--out`` or stdout."""
    from bio_megatron.parallel.distributed import single_process, teardown

    try:
        single_process()
        lines = [json.dumps(p) for p in predictions()]
    finally:
        teardown()
    _write_lines(args.out, lines)
    return 0


def _write_lines(out: str | None, lines: list[str]) -> None:
    """JSON lines to ``out`` (atomically) or to stdout."""
    from bio_megatron.utils.io import atomic_open

    text = "".join(line + "\n" for line in lines)
    if out:
        with atomic_open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


def _nbest_path(out: Path) -> Path:
    return out.with_name(out.stem + ".nbest.json")
