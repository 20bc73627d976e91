"""``bio-megatron bench finetune``: our NER and sentence-classification fine-tuning against plain transformers.

Both sides start from the same weights (one Hugging Face folder, :mod:`bio_megatron.bench.hf_models`) and see the
same examples (our task reader's, ``model.dataset.max_train_examples`` of them), batch and precision:

* **step**: whole train steps (forward, backward, clipping, Adam) on the same batches. Ours is the fine-tuning
  code path itself (``tasks.finetune.setup``, ``tasks.finetune_steps.Batches``, ``training.loop.train_step``:
  megatron-core DDP and optimizer); theirs ``AutoModelFor{Token,Sequence}Classification`` +
  ``torch.optim.AdamW(fused=True)`` (the Trainer's default) and ``clip_grad_norm_(1.0)``, under ``torch.autocast``
  for bf16 (``bench/finetune_sides.py``). Each side lives in a process of its own (``bench/side_process.py``: one
  heap would couple them) and the parent alternates their timed steps (ours, theirs, then theirs, ours, ...) so
  that other jobs' load weighs on both; examples/s from the mean step time. With ``--packing`` our side packs each micro-batch's examples into shared
  rows (``model.dataset.packing``: the same examples, losses and update, fewer padded positions) while transformers
  keeps the padded batch its Trainer would build; the JSON counts the token positions each side ran. With
  ``--group-by-length`` both sides take steps of similar-length examples (``model.dataset.group_by_length``; the
  same batches, as transformers' own ``group_by_length`` would give it).
* **epoch**: one epoch end to end, each side a fresh process as users run it: ``bio-megatron finetune`` (reading
  the files, tokenizing, training, the dev evaluation, saving the checkpoint) against
  :mod:`bio_megatron.bench.hf_baseline` (the same examples, tokenizing, training, dev predictions,
  ``save_pretrained``); wall seconds, start-up included.

Heads: NER uses one linear layer on both sides (HF's ``classifier``; ``model.head.num_fc_layers=1``); classification
has HF's pooler (dense + tanh on [CLS]) and classifier, ours NeMo's two-layer MLP on [CLS] with tanh: the same shape.
Our side labels only each word's first sub-token (``ignore_extra_tokens=true``), as HF's token-classification
recipe does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bio_megatron.bench.finetune_sides import recipe, worker
from bio_megatron.bench.predict import BASELINE, child_env, run_process
from bio_megatron.bench.side_process import SideProcess
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

SINGLE_LABEL = ("gad", "ddi", "pubmedqa", "bioasq_yesno", "mednli")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ner-train", help="NER training file (IOB word<TAB>tag), e.g. BC5CDR-chem train.tsv")
    parser.add_argument("--ner-dev", help="NER dev file for the epoch's evaluation (default: --ner-train)")
    parser.add_argument("--classify-train", help="classification training file in its dataset's own format")
    parser.add_argument("--classify-dev", help="classification dev file (default: --classify-train)")
    parser.add_argument("--classify-task", default="gad", choices=SINGLE_LABEL,
                        help="BLURB/clinical single-label dataset of --classify-train (default gad)")
    parser.add_argument("--model", default=None, help="Hugging Face folder (encoder, e.g. all-MiniLM-L6-v2: a "
                        "seeded task head is added); default: a seeded tiny BERT")
    parser.add_argument("--limit", type=int, default=600, help="training examples (default 600)")
    parser.add_argument("--dev-limit", type=int, default=200, help="dev examples of the epoch run (default 200)")
    parser.add_argument("--batch", type=int, default=16, help="examples per step, both sides (default 16)")
    parser.add_argument("--max-seq-length", type=int, default=128, help="sub-tokens per example (default 128)")
    parser.add_argument("--precision", default="32", choices=["32", "bf16"], help="both sides (default 32)")
    parser.add_argument("--lr", type=float, default=5e-5, help="learning rate, both sides")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--skip-step", action="store_true", help="only the epoch runs")
    parser.add_argument("--skip-epoch", action="store_true", help="only the step benchmark")
    parser.add_argument("--epoch-rounds", type=int, default=1,
                        help="epoch runs per side, alternating which goes first; the best of each is kept (default 1)")
    parser.add_argument("--packing", action="store_true",
                        help="our side packs each micro-batch's examples into shared rows (model.dataset.packing=true); "
                        "transformers gets the same examples padded, as its Trainer does")
    parser.add_argument("--group-by-length", action="store_true",
                        help="training steps of similar-length examples (model.dataset.group_by_length=true); "
                        "transformers takes the same batches, as its own group_by_length would give it")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default 1)")
    parser.add_argument("--json", default=None, help="write the results here (atomically)")


def _check(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(task, train, dev) per benchmarked task; every option problem at once (exit 2 before anything runs)."""
    from bio_megatron.utils.input_files import check_input_file

    bad = [f"{flag} must be >= 1, got {v}" for flag, v in
           (("--limit", args.limit), ("--dev-limit", args.dev_limit), ("--batch", args.batch),
            ("--steps", args.steps), ("--threads", args.threads), ("--epoch-rounds", args.epoch_rounds)) if v < 1]
    bad += [f"--warmup must be >= 0, got {args.warmup}"] if args.warmup < 0 else []
    bad += [f"--max-seq-length must be >= 8, got {args.max_seq_length}"] if args.max_seq_length < 8 else []
    if args.batch > args.limit:
        bad.append(f"--batch ({args.batch}) exceeds --limit ({args.limit}): not one whole step per epoch")
    if args.skip_step and args.skip_epoch:
        bad.append("--skip-step and --skip-epoch together leave nothing to measure")
    if not (args.ner_train or args.classify_train):
        bad.append("give --ner-train FILE and/or --classify-train FILE (the real data both sides train on)")
    if bad:
        raise ConfigError(bad)
    tasks = []
    for task, train, dev in (("ner", args.ner_train, args.ner_dev), ("classify", args.classify_train, args.classify_dev)):
        if train:
            tasks.append((task, str(check_input_file(train, f"--{task}-train").resolve()),
                          str(check_input_file(dev or train, f"--{task}-dev").resolve())))
    return tasks


def overrides(args: argparse.Namespace, task: str, folder: Path, train: str, dev: str, exp_dir: Path) -> list[str]:
    """Our side's recipe overrides: the bench's model, data, batch and precision; one epoch."""
    over = [f"model.restore_from_path={folder}", f"model.dataset.data_dir={Path(train).parent}",
            f"model.dataset.train_file={train}", f"model.dataset.dev_file={dev}", "model.dataset.test_file=null",
            f"model.dataset.max_train_examples={args.limit}", f"model.dataset.max_eval_examples={args.dev_limit}",
            f"model.dataset.max_seq_length={args.max_seq_length}", f"model.micro_batch_size={args.batch}",
            f"model.global_batch_size={args.batch}", f"trainer.precision={args.precision}", "trainer.max_epochs=1",
            "trainer.max_steps=-1", "trainer.val_check_interval=0", f"model.optim.lr={args.lr}",
            "model.optim.weight_decay=0.0", "trainer.gradient_clip_val=1.0", "model.hidden_dropout=0.1",
            "model.attention_dropout=0.1", f"exp_manager.exp_dir={exp_dir}", f"exp_manager.name=ours_{task}",
            "exp_manager.create_tensorboard_logger=false"]
    if args.packing:  # the same examples and losses, fewer padded tokens (tasks/packing.py)
        over.append("model.dataset.packing=true")
    if args.group_by_length:  # steps of similar-length examples (tasks/batch_order.py)
        over.append("model.dataset.group_by_length=true")
    if task == "ner":
        return over + ["model.head.num_fc_layers=1", "model.head.fc_dropout=0.1", "model.dataset.format=iob",
                       "model.dataset.ignore_extra_tokens=true"]
    return over + [f"model.dataset.task_name={args.classify_task}", "model.classifier_head.num_output_layers=2",
                   "model.classifier_head.fc_dropout=0.1"]


def measure_steps(args: argparse.Namespace, task: str, folder: Path, over: list[str]) -> dict:
    total = args.warmup + args.steps
    ours = SideProcess("ours side", worker, ("ours", {"task": task, "overrides": over, "total": total}, args.threads))
    hf = None
    try:
        hf = SideProcess("transformers side", worker, (
            "hf", {"task": task, "folder": str(folder), "lr": args.lr, "precision": args.precision}, args.threads))
        plan = ours.receive()  # ready, with the batches of every step
        hf.send(plan)
        hf.receive()
        sides = {"ours": ours, "transformers": hf}
        for i in range(args.warmup):
            for s in sides.values():
                s.request(i)
        times: dict[str, list[float]] = {n: [] for n in sides}
        for k in range(args.steps):
            order = list(sides) if k % 2 == 0 else list(sides)[::-1]
            for name in order:
                times[name].append(sides[name].request(args.warmup + k))
            log.info("step %d/%d: ours %.3f s, transformers %.3f s", k + 1, args.steps, times["ours"][-1],
                     times["transformers"][-1])
    finally:
        ours.close()
        if hf is not None:
            hf.close()
    timed = plan[args.warmup:]
    seqs = [max(int(b["attention_mask"].sum(-1).max()) for b in micro) for micro in timed]
    res: dict[str, Any] = {"steps": args.steps, "warmup": args.warmup, "batch": args.batch, "packing": args.packing,
                           "group_by_length": args.group_by_length,
                           "mean_padded_length": sum(micro[0]["input_ids"].shape[1] for micro in timed) / args.steps,
                           "mean_longest_example": sum(seqs) / len(seqs)}
    # Token positions each side's encoder ran per step (the real tokens are the same on both): HF's padded batch;
    # ours the same, or its packed rows.
    res["positions_per_step"] = {
        "ours": sum(b.get("packed_input_ids", b["input_ids"]).numel() for micro in timed for b in micro) / args.steps,
        "transformers": sum(b["input_ids"].numel() for micro in timed for b in micro) / args.steps,
        "real_tokens": sum(int(b["attention_mask"].sum()) for micro in timed for b in micro) / args.steps}
    for name, ts in times.items():
        mean = sum(ts) / len(ts)
        res[name] = {"step_s": ts, "mean_step_s": mean, "examples_per_s": args.batch / mean}
    res["ratio_examples_per_s"] = res["ours"]["examples_per_s"] / res["transformers"]["examples_per_s"]
    # on a shared CPU one slow step moves a mean: the ratio of median step times is the steadier figure
    res["ratio_median_step"] = statistics.median(times["transformers"]) / statistics.median(times["ours"])
    return res


# --- one epoch, whole process ----------------------------------------------------------------------------------
def _export_examples(args: argparse.Namespace, task: str, folder: Path, over: list[str],
                     tmp: Path) -> tuple[Path, Path, list[int]]:
    """Our task reader's train and dev examples as JSON lines for the baseline (the same examples by
    construction), and the order our run takes them in its epoch: both sides then train on the same batches, so
    neither epoch's figure rests on how much padding its own shuffle happened to draw."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.tasks.batch_order import train_order
    from bio_megatron.tasks.protocol import TASKS
    from bio_megatron.vocab.bpe import load_tokenizer

    cfg = load_finetune_config(task, recipe(task), over, 1)
    src = resolve_source(folder)
    reader = TASKS[task](cfg, load_tokenizer(src.vocab_file, cfg.model.tokenizer.do_lower_case), src.labels)
    paths = []
    for name in ("train", "dev"):
        split = reader.train if name == "train" else reader.split("dev")
        if task == "ner":
            rows = [{"words": s.words, "tags": s.tags} for s in split.sentences]
        else:
            rows = [{"text": e.text, "text_b": e.text_b, "label": reader.labels[e.target]} for e in split.examples]
        if name == "train" and len(rows) != len(split.features):  # the order indexes both sides' lists
            raise RuntimeError(f"bench finetune: {len(rows)} {task} training examples but {len(split.features)} "
                               "features: the two sides would not train on the same batches")
        path = tmp / f"{task}_{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths.append(path)
    order = train_order(len(reader.train.features), lambda i: reader.length(reader.train, i),
                        cfg.model.global_batch_size, cfg.trainer.seed, 0, cfg.model.dataset.group_by_length)
    return paths[0], paths[1], order


def measure_epoch(args: argparse.Namespace, task: str, folder: Path, over: list[str], tmp: Path) -> dict:
    train, dev, order = _export_examples(args, task, folder, over, tmp)
    env = child_env(args.threads)
    spec = tmp / f"hf_epoch_{task}.json"
    spec.write_text(json.dumps({"task": task, "model": str(folder), "train": str(train), "dev": str(dev),
                                "order": order,
                                "batch": args.batch, "lr": args.lr, "max_seq_length": args.max_seq_length,
                                "precision": args.precision, "seed": 42, "threads": args.threads,
                                "out": str(tmp / f"hf_epoch_{task}_out")}))
    # Sequential runs on a shared CPU: each side meets the load of its own minutes, so rounds alternate the order
    # and the best (least disturbed) run of each side is kept.
    runs: dict[str, list[dict]] = {"ours": [], "transformers": []}
    for r in range(args.epoch_rounds):
        for side in ("ours", "transformers") if r % 2 == 0 else ("transformers", "ours"):
            if side == "ours":
                shutil.rmtree(tmp / f"ours_{task}", ignore_errors=True)  # a fresh run each round
                res = run_process([sys.executable, "-m", "bio_megatron", "finetune", task, "--config",
                                   str(recipe(task))] + over, env, tmp / f"ours_epoch_{task}.log")
                found = sorted((tmp / f"ours_{task}").glob("*/results.json"))  # a one-seed sweep: <name>/seed42/
                res["train_seconds"] = json.loads(found[0].read_text()).get("train_seconds") if found else None
            else:
                res = run_process([sys.executable, str(BASELINE), "epoch", str(spec)], env, tmp / f"hf_epoch_{task}.log")
                res["phases"] = json.loads(res["stdout"].strip().splitlines()[-1])
            res.pop("stdout", None)
            log.info("epoch %s, round %d: %.1f s", side, r + 1, res["wall_s"])
            runs[side].append(res)
    ours = min(runs["ours"], key=lambda x: x["wall_s"])
    theirs = min(runs["transformers"], key=lambda x: x["wall_s"])
    phases = theirs.pop("phases")
    ours_result = {"train_seconds": ours.pop("train_seconds")}
    return {"train_examples": phases["train_examples"], "dev_examples": phases["dev_examples"],
            "steps": phases["steps"],
            "ours": {**ours, "train_seconds": ours_result["train_seconds"],
                     "wall_s_rounds": [x["wall_s"] for x in runs["ours"]]},
            "transformers": {**theirs, "phases_s": phases["seconds"],
                             "wall_s_rounds": [x["wall_s"] for x in runs["transformers"]]},
            "ratio_whole_process": theirs["wall_s"] / ours["wall_s"]}


def summary_lines(res: dict) -> list[str]:
    out = []
    precision = "fp32" if res["precision"] == "32" else res["precision"]
    for task, r in res["tasks"].items():
        if "step" in r:
            s = r["step"]
            packed = ((", ours packed" if s.get("packing") else "")
                      + (", grouped by length" if s.get("group_by_length") else ""))
            out.append(f"finetune {task} step (batch {s['batch']}, mean padded length {s['mean_padded_length']:.0f}{packed}, "
                       f"{precision}, {res['threads']} thread(s)): ours {s['ours']['examples_per_s']:.1f} "
                       f"examples/s, transformers {s['transformers']['examples_per_s']:.1f} examples/s, ratio "
                       f"{s['ratio_examples_per_s']:.2f}x (of median steps: {s['ratio_median_step']:.2f}x)"
                       + (f"; token positions per step: ours {pos['ours']:.0f}, transformers {pos['transformers']:.0f} "
                          f"({pos['real_tokens']:.0f} real)" if (pos := s.get("positions_per_step")) else ""))
        if "epoch" in r:
            e = r["epoch"]
            out.append(f"finetune {task} epoch ({e['train_examples']} examples + {e['dev_examples']} dev, whole process): "
                       f"ours {e['ours']['wall_s']:.1f} s, transformers {e['transformers']['wall_s']:.1f} s, ratio "
                       f"{e['ratio_whole_process']:.2f}x")
    out.append(f"finetune model: {res['model']}")
    return out


def run(args: argparse.Namespace) -> int:
    from bio_megatron.bench.hf_models import task_folder
    from bio_megatron.tasks.classify_data import dataset
    from bio_megatron.utils.io import check_output_file, write_json_atomic

    tasks = _check(args)
    if args.json:
        check_output_file(args.json)
    res: dict[str, Any] = {"benchmark": "finetune", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "precision": args.precision, "threads": args.threads, "limit": args.limit, "tasks": {}}
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp_name:
        tmp = Path(tmp_name)
        for task, train, dev in tasks:
            if task == "ner":
                from bio_megatron.corpus.iob import read_iob
                from bio_megatron.tasks.ner_data import build_label_map

                label_map = build_label_map(read_iob(train))
                labels, kind = sorted(label_map, key=label_map.get), "token"
            else:
                labels, kind = list(dataset(args.classify_task).labels), "sequence"
            folder, res["model"] = task_folder(args.model, kind, labels, tmp)
            over = overrides(args, task, folder, train, dev, tmp)
            entry: dict[str, Any] = {"train": train, "dev": dev}
            if not args.skip_step:
                entry["step"] = measure_steps(args, task, folder, over)
            if not args.skip_epoch:
                entry["epoch"] = measure_epoch(args, task, folder, over, tmp)
            res["tasks"][task] = entry
    if args.json:
        write_json_atomic(args.json, res)
    sys.stdout.write("".join(line + "\n" for line in summary_lines(res)))
    return 0
