"""Fine-tuning loop shared by NER, RE, QA and BLURB classify: set-up around ``training.loop.train``, dev
evaluation with the task's official-equivalent metric, best checkpoint kept by that metric, test evaluation of
the best.

A task (:class:`~bio_megatron.tasks.protocol.Task`, picked from ``TASKS`` by ``cfg.task``: ``tasks/ner.py``,
``re.py``, ``qa.py``, ``classify.py``) supplies the data splits, ``collate``, its head, ``loss``, ``outputs``
(per-example predictions from logits), ``score`` and ``write_predictions`` (test predictions beside
``<run>/test_predictions.jsonl``). ``prepare`` and ``setup`` read the source, the data and build the model;
:class:`FinetuneRun` is one run, its loop hooks as methods; the batches, forward step and evaluation pass it runs
are ``tasks/finetune_steps.py``.
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
from bio_megatron.tasks.distill import check_teacher, with_teacher
from bio_megatron.tasks.early_stopping import EarlyStopping, monitor_key
from bio_megatron.tasks.finetune_steps import Batches, forward_step, predict_split
from bio_megatron.tasks.protocol import TASKS, Task
from bio_megatron.training import checkpoint as ckpt
from bio_megatron.training import checkpoint_dir as ckpt_dir
from bio_megatron.training import resume_checks
from bio_megatron.training.guards import run_dir_lock
from bio_megatron.training.loop import LoopState, StepResult, train
from bio_megatron.training.metrics import MetricsWriter, RunLogFile, fmt_eta, memory_gib, write_hparams
from bio_megatron.training.optimizer import build_optimizer, build_scheduler, loss_scale
from bio_megatron.training.pretrain import wrap_for_training
from bio_megatron.training.signals import Interrupted, StopRequest
from bio_megatron.training.trackers import open_trackers
from bio_megatron.utils.errors import ConfigError, DataError, NonFiniteError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.bpe import load_tokenizer
from bio_megatron.vocab.builtin import resolve_vocab

log = get_logger(__name__)
LOG_FILE = "run.log"  # the run's log lines, in its folder beside metrics.jsonl, hparams.yaml and tensorboard/


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
        run = FinetuneRun(cfg, *built)
        run.restore()
        status, seconds = run.train()
        return run.finish(status, seconds)


class FinetuneRun:
    """One fine-tuning run on this rank, from the set-up model to ``results.json``. ``training.loop.train`` runs the
    steps; the methods are its hooks: progress (``on_step``), dev evaluation keeping the best checkpoint by the
    task's metric and stopping early (``evaluate_dev``), the save on preemption (``save_for_resume``)."""

    def __init__(self, cfg: FinetuneConfig, world, tokenizer, task: Task, model, ddp, dtype, padded: int) -> None:
        m, t, e = cfg.model, cfg.trainer, cfg.exp_manager
        self.cfg, self.tokenizer, self.task, self.model, self.dtype = cfg, tokenizer, task, model, dtype
        self.batches = Batches(task, cfg)
        self.per_epoch = self.batches.steps_per_epoch
        self.max_steps = t.max_steps if t.max_steps > 0 else t.max_epochs * self.per_epoch
        self.epochs = math.ceil(self.max_steps / self.per_epoch)
        self.every = t.val_every(self.per_epoch)
        self.optimizer = build_optimizer(m.optim, [ddp], dtype, t.gradient_clip_val, m.use_distributed_optimizer, m)
        self.scheduler = build_scheduler(self.optimizer, m.optim, self.max_steps)
        self.layout = ckpt.Layout.current(m.use_distributed_optimizer)
        self.run_dir = cfg.run_dir
        self.ckpt_root, self.resume_root = cfg.run_dir / "checkpoints", cfg.run_dir / "resume"
        self.is_writer = world.rank == 0
        resumable = e.resume_if_exists and self.resume_root.is_dir()
        self.resume = ckpt_dir.find_resume_checkpoint(self.resume_root) if resumable else None
        if self.is_writer and self.resume is None:
            shutil.rmtree(self.ckpt_root, ignore_errors=True)  # best-by-dev of *this* run only
        dist.barrier()
        self.dev = task.split("dev")
        if self.dev is None:
            raise ConfigError("model.dataset.dev_file is required (QA: or model.dataset.dev_holdout_fraction): the "
                              "best checkpoint is chosen on dev")
        self.state = LoopState(model=ddp, optimizer=self.optimizer, scheduler=self.scheduler,
                               forward_step=partial(forward_step, task=task, keep_outputs=False),
                               train_batches=self.batches.train, valid_batches=lambda k: [],
                               seq_length=m.dataset.max_seq_length, micro_batch_size=m.micro_batch_size,
                               max_steps=self.max_steps, max_nonfinite_steps=t.max_nonfinite_steps,
                               report_keys=getattr(task, "report_keys", ()))
        self.batches.state = self.state
        self.eval_state = LoopState(**{**self.state.__dict__,
                                       "forward_step": partial(forward_step, task=task, keep_outputs=True)})
        self.best = {"metric": -math.inf, "step": None, "dev": None, "path": None}
        self.early, self.stopped_early_at = EarlyStopping(cfg, task.metric), None
        self.history: list[dict] = []
        self.meta = {"task": cfg.task, "model_size": m.size_name(), "vocab_size": tokenizer.vocab_size,
                     "padded_vocab_size": padded, "labels": task.labels, "compute_dtype": dtype_name(dtype)}
        self.derived = {"max_steps": self.max_steps, "steps_per_epoch": self.per_epoch, "epochs": self.epochs,
                        "val_every_steps": self.every, "train_examples": len(task.train.features),
                        "dev_examples": len(self.dev.features), "world_size": dist.get_world_size(),
                        "data_parallel_size": ps.get_data_parallel_world_size(), "labels": task.labels,
                        "vocab_file": str(tokenizer.vocab_file), "padded_vocab_size": padded,
                        "compute_dtype": dtype_name(dtype), "resumed_at_step": None}
        self.stop: StopRequest | None = None  # train() takes the stop signals over while the steps run
        self.out: MetricsWriter | None = None  # opened by train()
        # examples/s since the last logged step; ETA from this process's mean step time (set when training starts)
        self.clock = {"start": 0.0, "start_step": 0, "last": 0.0, "last_step": 0}

    def restore(self) -> None:
        """A preempted run (``resume/``): model, optimizer, scheduler, RNG, best-so-far, history, early stopping."""
        if self.resume is None:
            return
        resume_checks.check_compatible(self.resume, self.cfg, self.tokenizer.vocab_file, "resume",
                                       "keep the saved value, or start afresh with another exp_manager.name (or "
                                       "exp_manager.resume_if_exists=false)")
        self.state.step = ckpt.load_checkpoint(self.resume, self.model, self.optimizer, self.scheduler, self.layout,
                                               compute_dtype=dtype_name(self.dtype))
        self.state.skipped_steps = ckpt_dir.read_metadata(self.resume).get("skipped_steps", 0)
        saved = json.loads((self.resume_root / "state.json").read_text())
        self.best.update(saved["best"],
                         metric=saved["best"]["metric"] if saved["best"]["step"] is not None else -math.inf)
        self.history.extend(saved["history"])
        self.early.replay(saved["history"])
        self.derived["resumed_at_step"] = self.state.step
        log.info("resumed fine-tuning from %s at step %d (best dev so far %s)", self.resume, self.state.step,
                 self.best["metric"])

    def evaluate_dev(self, step: int) -> None:
        if not self.state.checkpoint_safe():  # a NaN model must never become "best" (argmax of NaN logits scores)
            log.warning("step %d: dev evaluation skipped, the model is at a non-finite point", step)
            return
        task, metric = self.task, self.task.metric
        self.batches.state = self.eval_state
        dev_loss: list[float] = []
        scores = task.score(self.dev, predict_split(self.eval_state, self.batches, self.dev, len(self.dev.features),
                                                    dev_loss))
        self.batches.state = self.state
        value = float(scores[metric])
        self.history.append({"step": step, "dev_" + metric: value, "val_loss": dev_loss[0]})
        self.out.write({"step": step, "epoch": (step - 1) // self.per_epoch, "val_loss": dev_loss[0],
                        "dev_" + metric: value}, tensorboard={"val_loss": dev_loss[0], "val_" + metric: value})
        log.info("step %d: dev %s = %.4f (best %.4f)", step, metric, value, max(self.best["metric"], value))
        if value > self.best["metric"]:
            self.keep_best(step, value, scores)
        if self.early.update(self.history[-1]) and step < self.state.max_steps:  # the loop ends at the new max_steps
            log.info("step %d: early stopping: %s did not improve by more than %g for %d dev evaluations; the "
                     "checkpoint of step %s (best dev %s) is kept", step, self.early.key, self.early.min_delta,
                     self.early.patience, self.best["step"], metric)
            self.stopped_early_at, self.state.max_steps = step, step

    def keep_best(self, step: int, value: float, scores: dict) -> None:
        """Save the new best checkpoint (with ``label_ids.csv``) and remove the one it replaces."""
        old = self.best["path"]
        # The best checkpoint is for predict, export and further fine-tuning, never resumed (resume/ is): in fp32 its
        # weights are the whole trained state, so the Adam moments (two thirds of the bytes) stay out; in bf16/fp16
        # the exact fp32 values live in the optimizer's main parameters, so it keeps them.
        path = ckpt.save_checkpoint(self.ckpt_root, step, self.model, self.optimizer, self.scheduler, self.cfg,
                                    self.tokenizer.vocab_file, self.layout, self.meta,
                                    with_optimizer=self.dtype != torch.float32)
        if self.is_writer:
            if self.task.labels:
                (path / "label_ids.csv").write_text("\n".join(self.task.labels) + "\n", encoding="utf-8")
            if old is not None and Path(old) != path:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        self.best.update(metric=value, step=step, dev=scores, path=path)

    def on_step(self, s: int, r: StepResult) -> None:
        scale = loss_scale(self.optimizer)  # fp16 only
        skipped = self.state.skipped_steps
        counts = {**({"nonfinite": True, "skipped_steps": skipped} if r.nonfinite else {}),
                  **({"loss_scale": scale, "skipped_steps": skipped} if scale is not None else {})}
        self.history.append({"step": s, "loss": r.loss if math.isfinite(r.loss) else None, "lr": r.lr, **counts})
        if not (s % self.cfg.trainer.log_every_n_steps == 0 or s == 1 or s == self.max_steps or r.skipped):
            self.out.tb.scalars(s, {"loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}, train=True)
            return
        # examples/s over the steps since the last logged one; ETA from this process's mean step time (dev
        # evaluations included, so the estimate covers them too)
        now, clock = time.perf_counter(), self.clock
        examples_s = self.cfg.model.global_batch_size * (s - clock["last_step"]) / max(now - clock["last"], 1e-9)
        eta = (now - clock["start"]) / max(1, s - clock["start_step"]) * (self.max_steps - s)
        clock.update(last=now, last_step=s)
        epoch = (s - 1) // self.per_epoch
        self.out.write({"step": s, "epoch": epoch, "loss": r.loss, **r.extra, "lr": r.lr, "grad_norm": r.grad_norm,
                        "examples_per_sec": examples_s, "memory_gib": memory_gib(), "eta_s": round(eta, 1), **counts})
        overflow = r.skipped and not r.nonfinite and scale is not None
        log.info("epoch %d/%d | step %d/%d | loss %.5f | lr %.3g | grad norm %s | %s examples/s | ETA %s%s%s",
                 epoch + 1, self.epochs, s, self.max_steps, r.loss, r.lr,
                 f"{r.grad_norm:.3f}" if r.grad_norm is not None else "-", f"{examples_s:,.1f}", fmt_eta(eta),
                 f" | loss_scale {scale:.4g}" if scale is not None else "",
                 f" | NON-FINITE: update skipped ({skipped} skipped so far)" if r.nonfinite else
                 f" | fp16 gradient overflow: update skipped ({skipped} skipped so far)" if overflow else "")

    def save_for_resume(self, step: int) -> None:
        """On SIGTERM/SIGUSR1 (preemption): everything needed to continue exactly, beside the best checkpoint."""
        ckpt.save_checkpoint(self.resume_root, step, self.model, self.optimizer, self.scheduler, self.cfg,
                             self.tokenizer.vocab_file, self.layout, {**self.meta,
                                                                      "skipped_steps": self.state.skipped_steps})
        if self.is_writer:
            best = self.best
            kept = {**best, "path": str(best["path"]) if best["path"] else None,
                    "metric": best["metric"] if best["step"] is not None else None}
            write_json_atomic(self.resume_root / "state.json", {"best": kept, "history": self.history})
        dist.barrier()

    def train(self) -> tuple[str, float]:
        """Run the steps to the end (or the stop); returns the loop's status and the seconds it took."""
        cfg, m, state = self.cfg, self.cfg.model, self.state
        log.info("fine-tuning %s: %d train examples, %d step(s)/epoch, %d steps | TP %d PP %d DP %d | compute dtype %s",
                 cfg.task, len(self.task.train.features), self.per_epoch, self.max_steps,
                 m.tensor_model_parallel_size, m.pipeline_model_parallel_size, ps.get_data_parallel_world_size(),
                 describe_precision(self.dtype))
        if self.is_writer:  # the resolved config and what the run derived from it, as NeMo's hparams.yaml
            write_hparams(self.run_dir, to_dict(cfg), self.derived)
        trackers = open_trackers(cfg, self.run_dir, self.is_writer, {**to_dict(cfg), "derived": self.derived})
        self.out = MetricsWriter(self.run_dir, self.is_writer, cfg.exp_manager.create_tensorboard_logger,
                                 m.global_batch_size, fresh=self.resume is None, trackers=trackers)  # W&B / MLflow
        self.stop = StopRequest()  # SIGTERM/SIGUSR1/Ctrl-C: save resume/ at the end of the step (restored below)
        state.hooks = {"on_step": self.on_step, "should_validate": lambda s: s % self.every == 0 or s == self.max_steps,
                       "on_validate": lambda s, _: self.evaluate_dev(s), "val_batches": 0,
                       "should_save": lambda s: False, "save": self.save_for_resume, "should_stop": self.stop.agreed}
        t0 = time.perf_counter()
        self.clock.update(start=t0, last=t0, start_step=state.step, last_step=state.step)
        try:
            status = train(state)
        finally:
            self.stop.restore()
            self.out.close(failed=state.nonfinite_streak >= cfg.trainer.max_nonfinite_steps)
        return status, time.perf_counter() - t0

    def finish(self, status: str, seconds: float) -> dict:
        """The run's result: the best checkpoint's dev and test scores, ``results.json``; or the error that ended it."""
        state, best, run_dir = self.state, self.best, self.run_dir
        if status == "diverged":
            ckpt.shutdown_writer()
            raise NonFiniteError(f"fine-tuning stopped at step {state.step}: loss or gradients non-finite (NaN/Inf) "
                                 f"for {state.nonfinite_streak} steps in a row (trainer.max_nonfinite_steps="
                                 f"{self.cfg.trainer.max_nonfinite_steps}); lower model.optim.lr; no results.json "
                                 f"written for {run_dir}")
        result = {"task": self.cfg.task, "status": status, "best_step": best["step"], "dev": best["dev"],
                  "stopped_early_at": self.stopped_early_at, "checkpoint": str(best["path"]),
                  "train_seconds": round(seconds, 2), "history": self.history}
        if status == "interrupted":
            ckpt.shutdown_writer()
            if self.stop.keyboard:  # 130, as pretraining: a `finetune ... && predict ...` script must not go on
                raise Interrupted(f"fine-tuning interrupted by Ctrl-C at step {state.step} after saving "
                                  f"{self.resume_root}; run the same command to resume")
            log.info("interrupted at step %d; rerun with the same exp_manager.name to resume", state.step)
            return result
        if best["path"] is None:
            ckpt.shutdown_writer()
            raise NonFiniteError(f"fine-tuning of {run_dir} never reached a finite model to evaluate on dev "
                                 f"({state.skipped_steps} of {state.step} steps skipped as non-finite); lower "
                                 "model.optim.lr")
        self.score_test(result)
        if self.is_writer:
            write_json_atomic(run_dir / "results.json", result)
            shutil.rmtree(self.resume_root, ignore_errors=True)  # finished: nothing to resume
        ckpt.shutdown_writer()
        return result

    def score_test(self, result: dict) -> None:
        """The best checkpoint (chosen on dev) scored on test, its predictions written; read only now, so training
        and selection never saw the test set."""
        d = self.cfg.model.dataset
        if d.test_file:
            log.info("training done: scoring the checkpoint of step %d (chosen on dev) on test %s", self.best["step"],
                     Path(d.data_dir) / d.test_file)
        test = self.task.split("test")
        if test is not None and not test.features:
            ckpt.shutdown_writer()
            raise _no_examples(self.cfg, "test", d.test_file)
        if test is None:
            return
        ckpt.load_checkpoint(Path(self.best["path"]), self.model, model_only=True)
        self.batches.state = self.eval_state
        outputs = predict_split(self.eval_state, self.batches, test, len(test.features))
        result["test"] = self.task.score(test, outputs)
        written = self.task.write_predictions(test, outputs, self.run_dir / "test_predictions.jsonl") \
            if self.is_writer else None
        if written is not None:  # what `bio-megatron evaluate <task>` reads
            result["test_predictions"] = str(written)
