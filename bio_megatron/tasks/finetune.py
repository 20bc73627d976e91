"""Fine-tuning loop shared by NER, RE, QA and BLURB classify: set-up around ``training.loop.train``, dev
evaluation with the task's official-equivalent metric, best checkpoint kept by that metric, test evaluation of
the best.

A task (:class:`~bio_megatron.tasks.protocol.Task`, picked from ``TASKS`` by ``cfg.task``: ``tasks/ner.py``,
``re.py``, ``qa.py``, ``classify.py``) supplies the data splits, ``collate``, its head, ``loss``, ``outputs``
(per-example predictions from logits), ``score`` and ``write_predictions`` (test predictions beside
``<run>/test_predictions.jsonl``). Every rank builds the same global batch from the same seed; each data-parallel
rank takes its share, cut into micro-batches.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from bio_megatron.config.finetune import FinetuneConfig, validate
from bio_megatron.config.loader import to_dict
from bio_megatron.models.bert import describe_precision, dtype_name, precision_dtype
from bio_megatron.families.task import build_task_model, init_task_model
from bio_megatron.formats.fill import load_into, task_padded_vocab
from bio_megatron.formats.source import Source, apply_source_shape, resolve_source
from bio_megatron.parallel.distributed import init_distributed, init_model_parallel, resolve_world
from bio_megatron.tasks.batch_order import train_order
from bio_megatron.tasks.distill import check_teacher, with_teacher
from bio_megatron.tasks.early_stopping import EarlyStopping, monitor_key
from bio_megatron.tasks.packing import model_inputs, pack
from bio_megatron.tasks.protocol import TASKS, Split, Task
from bio_megatron.training import checkpoint as ckpt
from bio_megatron.training import resume_checks
from bio_megatron.training.guards import run_dir_lock
from bio_megatron.training.loop import LoopState, StepResult, reduce_losses, run_batches, train
from bio_megatron.training.metrics import MetricsWriter, RunLogFile, fmt_eta, memory_gib, write_hparams
from bio_megatron.training.optimizer import build_optimizer, build_scheduler, loss_scale
from bio_megatron.training.pretrain import to_device, wrap_for_training
from bio_megatron.training.signals import Interrupted, StopRequest
from bio_megatron.training.trackers import open_trackers
from bio_megatron.utils.errors import ConfigError, DataError, NonFiniteError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.builtin import resolve_vocab

log = get_logger(__name__)
# Micro-batches pad to their longest example rounded up to this (tensor-core tiles on a GPU; none on the CPU).
PAD_MULTIPLE = 8 if torch.cuda.is_available() else 1
LOG_FILE = "run.log"  # the run's log lines, in its folder beside metrics.jsonl, hparams.yaml and tensorboard/


def forward_step(data_iterator, model, task: Task, keep_outputs: bool):
    """One micro-batch through encoder + head; on the last stage the task loss (and, for evaluation, the
    per-example predictions) are reported."""
    b = to_device(next(data_iterator))
    args, kwargs = model_inputs(b)  # packed batches (model.dataset.packing) add the packed rows and their layout
    out = model(*args, **kwargs)
    if not ps.is_pipeline_last_stage():
        return out, None
    loss = task.loss(out, b)
    report = {"loss": loss.detach().clone(), **getattr(task, "last_report", {})}  # distillation's terms
    if keep_outputs:
        report["outputs"] = list(zip(b["index"].tolist(), task.outputs(out.detach().float(), b)))
    return loss, lambda output: (output, report)


def steps_per_epoch(train_examples: int, global_batch_size: int) -> int:
    """Optimizer steps per epoch: whole global batches (the remainder of an epoch is not a step; at least 1)."""
    return max(1, train_examples // global_batch_size)


class Batches:
    """Deterministic global batches (same on every rank) cut to this data-parallel rank's micro-batches."""

    def __init__(self, task: Task, cfg: FinetuneConfig):
        m = cfg.model
        self.task, self.seed = task, cfg.trainer.seed
        self.mbs, self.gbs = m.micro_batch_size, m.global_batch_size
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        self.max_len = m.dataset.max_seq_length
        self.packing = getattr(m.dataset, "packing", False)  # NER and classification (tasks/packing.py)
        self.group_by_length = m.dataset.group_by_length  # tasks/batch_order.py
        self.steps_per_epoch = steps_per_epoch(len(task.train.features), self.gbs)
        self.state: LoopState | None = None  # run_batches reads seq_length from it
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its order): drawn once per epoch

    def _micro(self, split: Split, indices: list[int]) -> list[dict]:
        # The global batch's longest example, so the same on every rank (one p2p shape per step). On a GPU rounded
        # up to a multiple of 8 for the tensor cores; on the CPU no rounding, which would only add padded positions
        # (5% of an unpacked BC5CDR epoch's, docs/BENCHMARKS.md).
        seq = max(self.task.length(split, max(i, 0)) for i in indices)
        seq = min(self.max_len, int(math.ceil(seq / PAD_MULTIPLE) * PAD_MULTIPLE))
        self.state.seq_length = seq
        per = len(indices) // self.dp
        mine = indices[self.dp_rank * per:(self.dp_rank + 1) * per]
        micro = [self.task.collate(split, mine[k:k + self.mbs], seq) for k in range(0, len(mine), self.mbs)]
        # Packed rows are max_seq_length long: a row then holds as many examples as fit, not one padded one.
        return [pack(b, self.max_len, self.task.tokenizer.pad) for b in micro] if self.packing else micro

    def epoch(self, epoch: int) -> list[int]:
        """The training examples' order in ``epoch`` (tasks/batch_order.py), the same on every rank."""
        if self._order[0] != epoch:
            split = self.task.train
            self._order = (epoch, train_order(len(split.features), lambda i: self.task.length(split, i), self.gbs,
                                              self.seed, epoch, self.group_by_length))
        return self._order[1]

    def train(self, step: int) -> list[dict]:
        epoch, within = divmod(step, self.steps_per_epoch)
        perm = self.epoch(epoch)
        idx = [perm[(within * self.gbs + k) % len(perm)] for k in range(self.gbs)]
        return self._micro(self.task.train, idx)

    def eval_groups(self, split: Split, n: int):
        """All examples in groups of ``micro x DP`` (padded with index -1 rows that are dropped later), shortest
        first: each group then pads to a length near its own examples' (40% fewer positions on BC5CDR's dev
        sentences). Outputs are keyed by example index, so the predictions and scores are those of any order."""
        size = self.mbs * self.dp
        order = sorted(range(n), key=lambda i: (self.task.length(split, i), i))
        for start in range(0, n, size):
            idx = order[start:start + size]
            yield self._micro(split, idx + [-1] * (size - len(idx)))


@torch.no_grad()
def predict_split(state: LoopState, batches: Batches, split: Split, n: int, losses: list | None = None) -> list:
    """Per-example outputs of ``split`` in order, gathered from the last stage's TP-rank-0 processes.
    ``losses`` (collective): gets the mean task loss over the split's micro-batches appended (NeMo's val_loss;
    the padding rows of the last group repeat example 0)."""
    state.model.eval()
    mine, records = [], []
    for mbs in batches.eval_groups(split, n):
        for rec in run_batches(state, mbs, forward_only=True):
            mine.extend(rec["outputs"])
            records.append(rec)
    state.model.train()
    if losses is not None:
        losses.append(reduce_losses(records))
    keep = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine if keep else [])
    merged = {i: o for part in gathered for i, o in part if i >= 0}
    return [merged[i] for i in range(n)]


def adopt_head_structure(m, src: Source) -> None:
    """Continuing from a checkpoint of the same task (e.g. BioASQ after SQuAD) keeps its head's shape; the
    recipe's dropout and init settings still apply."""
    saved = src.head or {}  # resolve_source fills it for checkpoints and for both kinds of HF folder
    for block in ("head", "classifier_head"):
        if not (saved.get(block) and hasattr(m, block)):
            continue
        for k in ("num_fc_layers", "num_output_layers", "activation"):
            if k in saved[block] and getattr(getattr(m, block), k) != saved[block][k]:
                log.info("model.%s.%s=%s taken from %s", block, k, saved[block][k], src.path)
                setattr(getattr(m, block), k, saved[block][k])
    if "fc_hidden_size" in saved:
        m.fc_hidden_size = saved["fc_hidden_size"]


def _no_examples(cfg: FinetuneConfig, name: str, file: str) -> DataError:
    d = cfg.model.dataset
    fmt = "SQuAD-style JSON" if cfg.task == "qa" else f"BLURB {d.task_name}" if cfg.task == "classify" else \
        f"{d.format} {'NER' if cfg.task == 'ner' else 'relation'}"
    return DataError(f"no usable {name} examples (the file is empty or has none in the expected {fmt} format); "
                     "fine-tuning needs at least one", str(Path(d.data_dir) / file))


def require_examples(cfg: FinetuneConfig, task: Task) -> None:
    """Zero usable examples in a split is an error naming its file: training on nothing, or choosing a "best"
    model on an empty dev set, would report success on no evidence. (Reads train and dev now, before any
    process group exists, so a bad file fails fast on every rank alike.) The test file (and a BioASQ golden
    file) must exist but is read only after training, to score the chosen checkpoint: nothing about the
    test set can reach training or model selection."""
    d = cfg.model.dataset
    for name, file in (("train", d.train_file), ("dev", d.dev_file or d.train_file)):
        split = task.train if name == "train" else task.split(name)
        if split is not None and not split.features:
            raise _no_examples(cfg, name, file)
    if d.dev_file and d.test_file and Path(d.dev_file) == Path(d.test_file):  # (tiny test recipes do this)
        log.warning("model.dataset.dev_file (%s) is also model.dataset.test_file: the checkpoint is chosen on the "
                    "test set, so its test score is not a held-out score", d.dev_file)
    later = [("model.dataset.test_file", Path(d.data_dir) / d.test_file if d.test_file else None),
             ("model.dataset.bioasq_golden", getattr(d, "bioasq_golden", None))]
    for key, path in later:
        if path is not None and not Path(path).exists():
            raise DataError(f"{key}: file not found (it is read after training, to score the chosen checkpoint)",
                            str(path))


def prepare(cfg: FinetuneConfig, world_size: int | None) -> tuple[Source | None, object, Task, bool]:
    """Everything before a process group exists: the restore source inspected (its shape applied to ``cfg``),
    the config validated, the tokenizer and the task's train and dev data read. ``--dry-run`` stops here.
    Returns ``(source, tokenizer, task, same_task)``."""
    m = cfg.model
    src: Source | None = resolve_source(m.restore_from_path) if m.restore_from_path else None
    if src is not None:
        apply_source_shape(m, src)
        if m.dataset.max_seq_length > m.max_position_embeddings:  # the recipe's length vs the checkpoint's
            raise ConfigError(f"model.dataset.max_seq_length ({m.dataset.max_seq_length}) exceeds "
                              f"max_position_embeddings ({m.max_position_embeddings}) of the checkpoint restored "
                              f"from {src.path} (model.restore_from_path); override it, e.g. "
                              f"model.dataset.max_seq_length={m.max_position_embeddings}")
    validate(cfg, world_size)
    # Data problems surface before any process group exists: a bad file fails fast, on every rank alike.
    vocab_file = src.vocab_file if src is not None and src.vocab_file else resolve_vocab(m.tokenizer.vocab_file)
    tokenizer = load_tokenizer(vocab_file, m.tokenizer.do_lower_case)  # WordPiece, or byte-level BPE (RoBERTa)
    same_task = src is not None and src.task == cfg.task
    if same_task and cfg.task == "classify":  # another BLURB dataset's head (other labels): the encoder only
        from bio_megatron.tasks.classify import same_head
        same_task = same_head(cfg, src.labels)
    if same_task:
        adopt_head_structure(m, src)
    task = TASKS[cfg.task](cfg, tokenizer, src.labels if same_task else None)
    monitor_key(cfg, task.metric)  # a monitor the task does not log: exit 2 before anything is written
    require_examples(cfg, task)
    check_teacher(cfg, task, tokenizer)  # task-specific distillation: refused now, before any process group
    return src, tokenizer, task, same_task


def setup(cfg: FinetuneConfig):
    """:func:`prepare` (source, tokenizer, task data: validated first), then distributed init, model, DDP."""
    m, t = cfg.model, cfg.trainer
    src, tokenizer, task, same_task = prepare(cfg, resolve_world().world_size)
    world = init_distributed()
    init_model_parallel(m.tensor_model_parallel_size, m.pipeline_model_parallel_size, t.seed)
    dtype = precision_dtype(t.precision)
    padded = task_padded_vocab(m, tokenizer.vocab_size, src)
    head = task.build_head(m)
    # Restoring: the source's weights first, then initial values for the rest only (the fresh head): the same
    # model as initialising all and overwriting, without drawing every weight first (seconds at 345m).
    model = build_task_model(m, padded, head, dtype, t.seed, initialise=src is None)
    if src is not None:
        init_task_model(model, m, t.seed, load_into(model, src, encoder_only=not same_task))
        log.info("restored %s from %s (%s)", "encoder + head" if same_task else "encoder", src.path, src.kind)
    ddp = wrap_for_training(model, m, dtype)
    task = with_teacher(cfg, task, tokenizer)  # task-specific distillation (tasks/distill.py); else the task itself
    return world, tokenizer, task, model, ddp, dtype, padded


def run_finetuning(cfg: FinetuneConfig) -> dict:
    """Fine-tune in this process (one rank of the world). Returns ``{"dev": best dev scores, "test": scores of
    the best checkpoint on test (if a test file is set), "best_step", "checkpoint", "history"}``. Raises
    ``LockError`` (exit 2) when another run holds the experiment directory, ``NonFiniteError`` (exit 3)
    when the loss or gradients stay NaN/Inf (then no ``results.json`` is written)."""
    built = setup(cfg)
    with run_dir_lock(cfg.run_dir, f"experiment directory {cfg.run_dir}"), \
            RunLogFile(cfg.run_dir / LOG_FILE, built[0].rank == 0):
        return _finetune(cfg, *built)


def _finetune(cfg: FinetuneConfig, world, tokenizer, task: Task, model, ddp, dtype, padded) -> dict:
    m, t, e = cfg.model, cfg.trainer, cfg.exp_manager
    batches = Batches(task, cfg)
    max_steps = t.max_steps if t.max_steps > 0 else t.max_epochs * batches.steps_per_epoch
    every = t.val_every(batches.steps_per_epoch)
    optimizer = build_optimizer(m.optim, [ddp], dtype, t.gradient_clip_val, m.use_distributed_optimizer, m)
    scheduler = build_scheduler(optimizer, m.optim, max_steps)
    layout = ckpt.Layout.current(m.use_distributed_optimizer)
    run_dir, ckpt_root, resume_root = cfg.run_dir, cfg.run_dir / "checkpoints", cfg.run_dir / "resume"
    is_writer = world.rank == 0
    resume = ckpt.find_resume_checkpoint(resume_root) if e.resume_if_exists and resume_root.is_dir() else None
    per_epoch = batches.steps_per_epoch
    epochs = math.ceil(max_steps / per_epoch)
    if is_writer and resume is None:
        shutil.rmtree(ckpt_root, ignore_errors=True)  # best-by-dev of *this* run only
    dist.barrier()
    dev = task.split("dev")
    if dev is None:
        raise ConfigError("model.dataset.dev_file is required (QA: or model.dataset.dev_holdout_fraction): the best "
                          "checkpoint is chosen on dev")
    state = LoopState(model=ddp, optimizer=optimizer, scheduler=scheduler,
                      forward_step=partial(forward_step, task=task, keep_outputs=False),
                      train_batches=batches.train, valid_batches=lambda k: [], seq_length=m.dataset.max_seq_length,
                      micro_batch_size=m.micro_batch_size, max_steps=max_steps,
                      max_nonfinite_steps=t.max_nonfinite_steps, report_keys=getattr(task, "report_keys", ()))
    batches.state = state
    eval_state = LoopState(**{**state.__dict__, "forward_step": partial(forward_step, task=task, keep_outputs=True)})
    best = {"metric": -math.inf, "step": None, "dev": None, "path": None}
    early, stopped_early = EarlyStopping(cfg, task.metric), {"at": None}
    history: list[dict] = []
    if resume is not None:  # a preempted run: model, optimizer, scheduler, RNG, best-so-far and history
        resume_checks.check_compatible(resume, cfg, tokenizer.vocab_file, "resume",
                                       "keep the saved value, or start afresh with another exp_manager.name (or "
                                       "exp_manager.resume_if_exists=false)")
        state.step = ckpt.load_checkpoint(resume, model, optimizer, scheduler, layout,
                                          compute_dtype=dtype_name(dtype))
        state.skipped_steps = ckpt.read_metadata(resume).get("skipped_steps", 0)
        saved = json.loads((resume_root / "state.json").read_text())
        best.update(saved["best"], metric=saved["best"]["metric"] if saved["best"]["step"] is not None else -math.inf)
        history.extend(saved["history"])
        early.replay(saved["history"])
        log.info("resumed fine-tuning from %s at step %d (best dev so far %s)", resume, state.step, best["metric"])
    meta = {"task": cfg.task, "model_size": m.size_name(), "vocab_size": tokenizer.vocab_size,
            "padded_vocab_size": padded, "labels": task.labels, "compute_dtype": dtype_name(dtype)}

    def evaluate_dev(step: int) -> None:
        if not state.checkpoint_safe():  # a NaN model must never become "best" (argmax of NaN logits scores)
            log.warning("step %d: dev evaluation skipped, the model is at a non-finite point", step)
            return
        batches.state = eval_state
        dev_loss: list[float] = []
        scores = task.score(dev, predict_split(eval_state, batches, dev, len(dev.features), dev_loss))
        batches.state = state
        value = float(scores[task.metric])
        history.append({"step": step, "dev_" + task.metric: value, "val_loss": dev_loss[0]})
        out.write({"step": step, "epoch": (step - 1) // per_epoch, "val_loss": dev_loss[0],
                   "dev_" + task.metric: value},
                  tensorboard={"val_loss": dev_loss[0], "val_" + task.metric: value})
        log.info("step %d: dev %s = %.4f (best %.4f)", step, task.metric, value, max(best["metric"], value))
        if value > best["metric"]:
            old = best["path"]
            # The best checkpoint is for predict, export and further fine-tuning, never resumed (resume/ is):
            # in fp32 its weights are the whole trained state, so the Adam moments (two thirds of the bytes) stay
            # out; in bf16/fp16 the exact fp32 values live in the optimizer's main parameters, so it keeps them.
            path = ckpt.save_checkpoint(ckpt_root, step, model, optimizer, scheduler, cfg, tokenizer.vocab_file,
                                        layout, meta, with_optimizer=dtype != torch.float32)
            if is_writer:
                if task.labels:
                    (path / "label_ids.csv").write_text("\n".join(task.labels) + "\n", encoding="utf-8")
                if old is not None and Path(old) != path:
                    shutil.rmtree(old, ignore_errors=True)
            dist.barrier()
            best.update(metric=value, step=step, dev=scores, path=path)
        if early.update(history[-1]) and step < state.max_steps:  # the loop ends at the new max_steps
            log.info("step %d: early stopping: %s did not improve by more than %g for %d dev evaluations; the "
                     "checkpoint of step %s (best dev %s) is kept", step, early.key, early.min_delta, early.patience,
                     best["step"], task.metric)
            stopped_early["at"], state.max_steps = step, step

    clock = {"start": 0.0, "start_step": state.step, "last": 0.0, "last_step": state.step}  # set when training starts

    def on_step(s: int, r: StepResult) -> None:
        scale = loss_scale(optimizer)  # fp16 only
        history.append({"step": s, "loss": r.loss if math.isfinite(r.loss) else None, "lr": r.lr,
                        **({"nonfinite": True, "skipped_steps": state.skipped_steps} if r.nonfinite else {}),
                        **({"loss_scale": scale, "skipped_steps": state.skipped_steps} if scale is not None else {})})
        if not (s % t.log_every_n_steps == 0 or s == 1 or s == max_steps or r.skipped):
            tb.scalars(s, {"loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}, train=True)
            return
        # examples/s over the steps since the last logged one; ETA from this process's mean step time (dev
        # evaluations included, so the estimate covers them too)
        now = time.perf_counter()
        examples_s = m.global_batch_size * (s - clock["last_step"]) / max(now - clock["last"], 1e-9)
        eta = (now - clock["start"]) / max(1, s - clock["start_step"]) * (max_steps - s)
        clock.update(last=now, last_step=s)
        epoch = (s - 1) // per_epoch
        out.write({"step": s, "epoch": epoch, "loss": r.loss, **r.extra, "lr": r.lr, "grad_norm": r.grad_norm,
                   "examples_per_sec": examples_s, "memory_gib": memory_gib(), "eta_s": round(eta, 1),
                   **({"nonfinite": True, "skipped_steps": state.skipped_steps} if r.nonfinite else {}),
                   **({"loss_scale": scale, "skipped_steps": state.skipped_steps} if scale is not None else {})})
        overflow = r.skipped and not r.nonfinite and scale is not None
        log.info("epoch %d/%d | step %d/%d | loss %.5f | lr %.3g | grad norm %s | %s examples/s | ETA %s%s%s",
                 epoch + 1, epochs, s, max_steps, r.loss, r.lr,
                 f"{r.grad_norm:.3f}" if r.grad_norm is not None else "-", f"{examples_s:,.1f}", fmt_eta(eta),
                 f" | loss_scale {scale:.4g}" if scale is not None else "",
                 f" | NON-FINITE: update skipped ({state.skipped_steps} skipped so far)" if r.nonfinite else
                 f" | fp16 gradient overflow: update skipped ({state.skipped_steps} skipped so far)" if overflow
                 else "")

    def save_for_resume(step: int) -> None:
        """On SIGTERM/SIGUSR1 (preemption): everything needed to continue exactly, beside the best checkpoint."""
        ckpt.save_checkpoint(resume_root, step, model, optimizer, scheduler, cfg, tokenizer.vocab_file, layout,
                             {**meta, "skipped_steps": state.skipped_steps})
        if is_writer:
            kept = {**best, "path": str(best["path"]) if best["path"] else None,
                    "metric": best["metric"] if best["step"] is not None else None}
            write_json_atomic(resume_root / "state.json", {"best": kept, "history": history})
        dist.barrier()

    stop = StopRequest()
    state.hooks = {"on_step": on_step, "should_validate": lambda s: s % every == 0 or s == max_steps,
                   "on_validate": lambda s, _: evaluate_dev(s), "val_batches": 0,
                   "should_save": lambda s: False, "save": save_for_resume, "should_stop": stop.agreed}
    log.info("fine-tuning %s: %d train examples, %d step(s)/epoch, %d steps | TP %d PP %d DP %d | compute dtype %s",
             cfg.task, len(task.train.features), batches.steps_per_epoch, max_steps, m.tensor_model_parallel_size,
             m.pipeline_model_parallel_size, ps.get_data_parallel_world_size(), describe_precision(dtype))
    derived = {"max_steps": max_steps, "steps_per_epoch": per_epoch, "epochs": epochs, "val_every_steps": every,
               "train_examples": len(task.train.features), "dev_examples": len(dev.features),
               "world_size": dist.get_world_size(), "data_parallel_size": ps.get_data_parallel_world_size(),
               "labels": task.labels, "vocab_file": str(tokenizer.vocab_file), "padded_vocab_size": padded,
               "compute_dtype": dtype_name(dtype), "resumed_at_step": state.step if resume is not None else None}
    if is_writer:  # the resolved config and what the run derived from it, as NeMo's hparams.yaml
        write_hparams(run_dir, to_dict(cfg), derived)
    trackers = open_trackers(cfg, run_dir, is_writer, {**to_dict(cfg), "derived": derived})  # W&B / MLflow
    out = MetricsWriter(run_dir, is_writer, e.create_tensorboard_logger, m.global_batch_size, fresh=resume is None,
                        trackers=trackers)
    tb = out.tb
    t0 = time.perf_counter()
    clock.update(start=t0, last=t0)
    try:
        status = train(state)
    finally:
        stop.restore()
        out.close(failed=state.nonfinite_streak >= t.max_nonfinite_steps)
    if status == "diverged":
        ckpt.shutdown_writer()
        raise NonFiniteError(f"fine-tuning stopped at step {state.step}: loss or gradients non-finite (NaN/Inf) for "
                             f"{state.nonfinite_streak} steps in a row (trainer.max_nonfinite_steps="
                             f"{t.max_nonfinite_steps}); lower model.optim.lr; no results.json written for {run_dir}")
    result = {"task": cfg.task, "status": status, "best_step": best["step"], "dev": best["dev"],
              "stopped_early_at": stopped_early["at"],
              "checkpoint": str(best["path"]), "train_seconds": round(time.perf_counter() - t0, 2), "history": history}
    if status == "interrupted":
        ckpt.shutdown_writer()
        if stop.keyboard:  # 130, as pretraining: a `finetune ... && predict ...` script must not go on
            raise Interrupted(f"fine-tuning interrupted by Ctrl-C at step {state.step} after saving "
                              f"{resume_root}; run the same command to resume")
        log.info("interrupted at step %d; rerun with the same exp_manager.name to resume", state.step)
        return result
    if best["path"] is None:
        ckpt.shutdown_writer()
        raise NonFiniteError(f"fine-tuning of {run_dir} never reached a finite model to evaluate on dev "
                             f"({state.skipped_steps} of {state.step} steps skipped as non-finite); lower model.optim.lr")
    if cfg.model.dataset.test_file:  # read only now: training and selection never saw the test set
        log.info("training done: scoring the checkpoint of step %d (chosen on dev) on test %s", best["step"],
                 Path(cfg.model.dataset.data_dir) / cfg.model.dataset.test_file)
    test = task.split("test")
    if test is not None and not test.features:
        ckpt.shutdown_writer()
        raise _no_examples(cfg, "test", cfg.model.dataset.test_file)
    if test is not None:
        ckpt.load_checkpoint(Path(best["path"]), model, model_only=True)
        batches.state = eval_state
        outputs = predict_split(eval_state, batches, test, len(test.features))
        result["test"] = task.score(test, outputs)
        written = task.write_predictions(test, outputs, run_dir / "test_predictions.jsonl") if is_writer else None
        if written is not None:  # what `bio-megatron evaluate <task>` reads
            result["test_predictions"] = str(written)
    if is_writer:
        write_json_atomic(run_dir / "results.json", result)
        shutil.rmtree(resume_root, ignore_errors=True)  # finished: nothing to resume
    ckpt.shutdown_writer()
    return result
