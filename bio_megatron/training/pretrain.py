"""Pretraining of Megatron BERT (masked LM, +/- NSP; RoBERTa's MLM; ELECTRA's replaced-token detection):
set-up around the shared loop, and ``run_pretraining``."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

from bio_megatron.config.loader import to_dict
from bio_megatron.config.family_keys import electra_shapes
from bio_megatron.config.pretrain import ModelConfig, PretrainConfig, validate
from bio_megatron.config.run import ExpManagerConfig, TrainerConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.data.pretrain import PretrainData, load_tokenizer
from bio_megatron.families import family_of_model
from bio_megatron.models.bert import describe_precision, dtype_name, precision_dtype
from bio_megatron.models.init import init_weights
from bio_megatron.parallel import seam
from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
from bio_megatron.training import checkpoint as ckpt
from bio_megatron.training import checkpoint_dir as ckpt_dir
from bio_megatron.training import electra_loss, memory, resume_checks
from bio_megatron.training.disk_full import no_space
from bio_megatron.training.guards import run_dir_lock
from bio_megatron.training.loop import LoopState, StepResult, guarded_save, train
from bio_megatron.training.metrics import RunLogFile, RunLogger, device_peak_tflops, flops_per_sequence, write_hparams
from bio_megatron.training.trackers import open_trackers
from bio_megatron.training.optimizer import build_optimizer, build_scheduler, loss_scale
from bio_megatron.training.signals import Interrupted, StopRequest
from bio_megatron.utils.errors import CheckpointError, DataError, NonFiniteError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def to_device(batch: dict) -> dict:
    return {k: v.cuda(non_blocking=True) for k, v in batch.items()} if torch.cuda.is_available() else batch


def forward_step(data_iterator, model, binary_head: bool):
    """One micro-batch: MLM loss averaged over masked positions (+ the NSP/SOP loss when enabled)."""
    b = to_device(next(data_iterator))
    out = model(b["text"], b["padding_mask"], tokentype_ids=b["types"], lm_labels=b["labels"])
    if not ps.is_pipeline_last_stage():
        return out, None  # hidden states for the next stage; the schedule never calls loss_func here
    lm_loss, binary_logits = out
    mask = b["loss_mask"].float()
    loss = (lm_loss.float() * mask).sum() / mask.sum().clamp(min=1.0)
    if binary_head:
        loss = loss + torch.nn.functional.cross_entropy(binary_logits.float(), b["is_random"])
    report = {"loss": loss.detach().clone()}
    return loss, lambda output: (output, report)


def electra_forward_step(data_iterator, model, seed: int, weight: float):
    """One micro-batch of ELECTRA: generator MLM + ``weight`` x replaced-token detection (PP is always 1)."""
    batch = next(data_iterator)
    # Validation draws other noise than training: its sample positions restart at 0.
    seeds = electra_loss.noise_seeds(batch["sample_index"], seed, "train" if model.training else "valid")
    b = to_device(batch)
    out = model(b["text"], b["padding_mask"], b["types"], b["labels"], b["loss_mask"], seeds)
    loss, report = electra_loss.electra_loss(*out, b["padding_mask"], weight)
    return loss, lambda output: (output, report)


def _flops_per_sequence(m: ModelConfig, padded_vocab: int) -> float:
    """Training matmul FLOPs of one sequence: BERT's, or ELECTRA's discriminator (1-logit head) plus its
    generator (projection, layers, and the LM head on the masked tokens only)."""
    seq = m.encoder_seq_length
    if m.objective != "electra":
        return flops_per_sequence(m.shape(), seq, padded_vocab)
    h, g = m.shape().hidden_size, electra_shapes(m)
    gh, masked = g.hidden_size, m.data.masked_lm_prob * seq
    generator = (flops_per_sequence(g, seq, 0) - 3 * seq * 2 * gh * gh  # its layers (not BERT's dense head)
                 + 3 * (seq * 2 * h * gh * (gh != h) + masked * 2 * (gh * h + h * padded_vocab)))
    return flops_per_sequence(m.shape(), seq, 1) + generator


def build_stage(cfg: PretrainConfig, vocab_size: int, dtype: torch.dtype):
    """This rank's model stage, initialised layout-invariantly, wrapped in megatron-core DDP."""
    m = cfg.model
    model = family_of_model(m).build_pretraining_model(m, vocab_size, dtype)
    init_weights(model, cfg.trainer.seed, m.init_method_std, m.shape().num_layers)
    return model, wrap_for_training(model, m, dtype)


def wrap_for_training(model: torch.nn.Module, m: ModelConfig, dtype: torch.dtype) -> DistributedDataParallel:
    """``model`` ready for megatron's schedules, as pretraining and fine-tuning train it: half-precision weights
    with fp32 outputs to the loss (``Float16Module``, as megatron's trainer), megatron DDP with fp32 gradient
    reduction, gradient-accumulation fusion per ``model.gradient_accumulation_fusion``, and the config hooks the
    schedules call (gradient finalisation, no-sync)."""
    stage = model
    if dtype != torch.float32:
        from megatron.core.transformer.module import Float16Module

        stage = Float16Module(model.config, model)
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=m.use_distributed_optimizer)
    ddp = DistributedDataParallel(config=model.config, ddp_config=ddp_cfg, module=stage)
    seam.install("model", ddp=ddp, setting=m.gradient_accumulation_fusion)  # gradient-accumulation fusion
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    return ddp


def continued_from(cfg, tokenizer) -> tuple[Path | None, Path | None]:
    """(checkpoint resumed, resolved through its metadata; path restored from) of a run, each checked compatible with
    ``cfg`` and the vocabulary in one line: pretraining's and distillation's start, settled before anything
    allocates. Stale half-written saves of the run are removed first."""
    e, m = cfg.exp_manager, cfg.model
    ckpt_root = cfg.run_dir / "checkpoints"
    ckpt_dir.remove_stale_saves(ckpt_root)
    resume = Path(e.resume_from_checkpoint) if e.resume_from_checkpoint else (
        ckpt_dir.find_resume_checkpoint(ckpt_root) if e.resume_if_exists else None)
    restore = Path(m.restore_from_path) if m.restore_from_path and resume is None else None
    if resume is not None:
        resume = Path(ckpt_dir.read_metadata(resume)["path"])
        resume_checks.check_compatible(resume, cfg, tokenizer.vocab_file, "resume")
    elif restore is not None:
        resume_checks.check_compatible(Path(ckpt_dir.read_metadata(restore)["path"]), cfg, tokenizer.vocab_file,
                                       "restore")
    return resume, restore


def diverged(run_dir: Path, ckpt_root: Path, state: LoopState) -> NonFiniteError:
    """Record the failure in ``status.json`` (rank 0) and build the error every rank raises."""
    latest = ckpt_root / "latest"
    kept = f"iteration {latest.read_text().strip()}" if latest.is_file() else "none was saved"
    reason = (f"loss or gradients non-finite (NaN/Inf) for {state.nonfinite_streak} steps in a row "
              f"(trainer.max_nonfinite_steps={state.max_nonfinite_steps}); lower model.optim.lr or raise warmup")
    if torch.distributed.get_rank() == 0:
        write_json_atomic(run_dir / "status.json", {"state": "failed", "reason": reason, "step": state.step,
                                                    "skipped_steps": state.skipped_steps})
    return NonFiniteError(f"training stopped at step {state.step}: {reason}; the last finite checkpoint "
                          f"({kept}) stays {latest}")


def run_steps(state: LoopState, save: Callable[[int], object], runlog: RunLogger, run_dir: Path, ckpt_root: Path,
              save_last: bool) -> str:
    """The steps of a checkpointed run (pretraining, distillation) from ``state.step`` to their end; returns the
    loop's status, written to ``status.json``. The stop signals (SIGTERM, SIGUSR1, Ctrl-C) are taken over only while
    the steps run, and restored whatever happens; a finished run saves its last checkpoint (``save_last``), a
    diverged one raises NonFiniteError, a Ctrl-C Interrupted (exit 130) once the checkpoint is saved."""
    start, t0 = state.step, time.perf_counter()
    runlog.start(start)
    stop = StopRequest()
    state.hooks["should_stop"] = stop.agreed
    try:
        status = train(state)
        if status == "finished" and save_last and state.step > start:
            guarded_save(state, save, "final")  # (a run resumed at max_steps has its final checkpoint already)
        if status == "diverged":
            raise diverged(run_dir, ckpt_root, state)
        ckpt_dir.write_status(run_dir, status, state.step)
        if status == "interrupted" and stop.keyboard:
            latest = ckpt_root / "latest"
            kept = f"iteration {latest.read_text().strip()}" if latest.is_file() else "none"
            raise Interrupted(f"interrupted by Ctrl-C at step {state.step} (status.json: interrupted; {latest}: "
                              f"{kept}); run the same command to resume")
    finally:
        runlog.close()
        stop.restore()
        ckpt.shutdown_writer()
    log.info("%s at step %d in %.1f s; run directory %s", status, state.step, time.perf_counter() - t0, run_dir)
    return status


def _shape_name(m: ModelConfig) -> str:
    """``345m (confirmed)``, or for a shape overridden key by key the row it equals: ``base shape (model.size 345m with
    overrides)``."""
    shape = m.shape()
    if shape.status != "custom":
        return f"{m.size} ({shape.status})"
    return f"{m.size_name()} shape (model.size {m.size} with overrides)"


def load_continued(resume: Path | None, restore: Path | None, model, optimizer, scheduler, layout: ckpt.Layout,
                   dtype: torch.dtype) -> tuple[int, int, dict]:
    """Load what the run continues from, as ``continued_from`` settled it: a resume (everything; the step, the
    run's skipped-step count and the checkpoint's recorded origin are returned) or a restore (model weights only,
    a fresh optimizer; distillation passes None: its student is built from the restore); neither: (0, 0, {})."""
    if resume is not None:
        step = ckpt.load_checkpoint(resume, model, optimizer, scheduler, layout, compute_dtype=dtype_name(dtype))
        log.info("resumed from %s at step %d", resume, step)
        # the run's count of skipped steps, not this process's
        return step, ckpt_dir.read_metadata(resume).get("skipped_steps", 0), ckpt_dir.unverified_origin(resume)
    if restore is not None:
        ckpt.load_checkpoint(restore, model, optimizer, model_only=True, compute_dtype=dtype_name(dtype))
        log.info("initialised model weights from %s (continued pretraining; fresh optimizer)", restore)
    return 0, 0, {}


def step_logger(t: TrainerConfig, runlog: RunLogger, optimizer, dtype: torch.dtype, start: int,
                metrics: Callable[[dict], dict], skipped: Callable[[], int]) -> Callable[[int, StepResult], None]:
    """The loop's ``on_step`` hook of a pretraining-style run: every ``log_every_n_steps``, the first and last step
    and every skipped one logged with lr, grad norm, loss scale and the objective's own ``metrics`` of the step."""
    def on_step(s: int, r: StepResult) -> None:
        if s % t.log_every_n_steps == 0 or s == t.max_steps or s == start + 1 or r.skipped:
            scale = loss_scale(optimizer)
            runlog.log_step(s, r.loss, r.lr, r.grad_norm, skipped_steps=skipped(), nonfinite=r.nonfinite,
                            overflow=r.skipped and not r.nonfinite and scale is not None, loss_scale=scale,
                            compute_dtype=dtype_name(dtype), **metrics(r.extra))
    return on_step


def loop_hooks(t: TrainerConfig, e: ExpManagerConfig, runlog: RunLogger, on_step: Callable[[int, StepResult], None],
               save: Callable[[int], None]) -> dict:
    """``LoopState.hooks`` of a pretraining-style run: validation every ``val_check_interval`` steps and at the end
    (``limit_val_batches`` batches), a checkpoint every ``every_n_train_steps`` (0: none but the last)."""
    every = e.checkpoint_callback_params.every_n_train_steps
    return {"on_step": on_step, "should_validate": lambda s: s % t.val_check_interval == 0 or s == t.max_steps,
            "on_validate": lambda s, v: v is not None and runlog.log_validation(s, v),
            "val_batches": t.limit_val_batches, "should_save": lambda s: every > 0 and s % every == 0, "save": save}


def _announce(cfg: PretrainConfig, num_microbatches: int, dtype: torch.dtype, step: int) -> None:
    """The run's start line: shape, layout, batch, precision and steps (and ELECTRA's generator)."""
    m, shape = cfg.model, cfg.model.shape()
    log.info("pretraining %s: %d layers, hidden %d, heads %d | TP %d PP %d DP %d | %d micro-batch(es) of %d "
             "per step | compute dtype %s | from step %d to %d", _shape_name(m), shape.num_layers,
             shape.hidden_size, shape.num_attention_heads, m.tensor_model_parallel_size,
             m.pipeline_model_parallel_size, ps.get_data_parallel_world_size(), num_microbatches,
             m.micro_batch_size, describe_precision(dtype), step, cfg.trainer.max_steps)
    if m.objective == "electra":
        g = electra_shapes(m)
        log.info("ELECTRA: generator hidden %d, heads %d, FFN %d (fraction %.4g); loss = generator + %g x "
                 "discriminator", g.hidden_size, g.num_attention_heads, g.ffn_hidden_size,
                 m.generator_hidden_fraction, m.discriminator_loss_weight)


def run_pretraining(cfg: PretrainConfig) -> str:
    """Pretrain per ``cfg`` in this process (one rank of the world). Returns "finished" or "interrupted";
    raises ``NonFiniteError`` (exit 3) when the loss or gradients stay NaN/Inf, ``LockError`` (exit 2) when
    another run holds the run directory."""
    world = init_distributed()
    validate(cfg, world.world_size)
    family_of_model(cfg.model)  # model.family checked against the registry before the run directory is touched
    load_tokenizer(cfg)  # so is the vocabulary (a missing or bad vocab.txt / .model): nothing is written
    # Locked before anything (stale-save removal, index cache, metrics) touches the run directory.
    with run_dir_lock(cfg.run_dir, f"run directory {cfg.run_dir}"), \
            RunLogFile(cfg.run_dir / "run.log", world.rank == 0):  # the run's log lines, in its folder too
        try:
            return _pretrain(cfg, world)
        except OSError as exc:  # the metrics, TensorBoard or status files of a full disk (saves say so themselves)
            if no_space(exc) is None:
                raise
            raise CheckpointError(f"no space left on {exc.filename or cfg.run_dir} (run directory {cfg.run_dir}); "
                                  "free space, then run the same command to resume from checkpoints/latest") from None


def _pretrain(cfg: PretrainConfig, world) -> str:
    m, t, e = cfg.model, cfg.trainer, cfg.exp_manager
    init_model_parallel(m.tensor_model_parallel_size, m.pipeline_model_parallel_size, t.seed)
    dtype = precision_dtype(t.precision)
    tokenizer = load_tokenizer(cfg)
    if tokenizer.pad != 0 and m.objective != "mlm":  # objective mlm takes the masks from the sample instead
        raise DataError(f"[PAD] must have id 0 (found {tokenizer.pad}): megatron-core's BERT dataset derives the "
                        "padding mask from it; a RoBERTa (BPE) vocabulary needs model.objective=mlm",
                        tokenizer.vocab_file)
    run_dir, ckpt_root = cfg.run_dir, cfg.run_dir / "checkpoints"
    is_writer = world.rank == 0
    padded = padded_vocab_size(tokenizer.vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    # What is continued from (and whether it may be) is settled before the data pipeline and the model allocate
    # anything: a mismatch with the checkpoint is reported as the checkpoint's, in one line.
    resume, restore = continued_from(cfg, tokenizer)
    if not t.skip_memory_check:
        memory.check_fits(m, padded, dtype, ps.get_data_parallel_world_size())
    data = PretrainData(cfg, tokenizer, ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(),
                        Path(m.data.index_mapping_dir or run_dir / "index_cache"))
    model, ddp = build_stage(cfg, tokenizer.vocab_size, dtype)
    optimizer = build_optimizer(m.optim, [ddp], dtype, t.gradient_clip_val, m.use_distributed_optimizer, m)
    scheduler = build_scheduler(optimizer, m.optim, t.max_steps)
    layout = ckpt.Layout.current(m.use_distributed_optimizer)

    step, skipped, origin = load_continued(resume, restore, model, optimizer, scheduler, layout, dtype)
    runlog = RunLogger(run_dir, is_writer, e.create_tensorboard_logger, m.global_batch_size * m.encoder_seq_length,
                       m.global_batch_size * _flops_per_sequence(m, padded),
                       world.world_size, device_peak_tflops(dtype), t.max_steps, samples_per_step=m.global_batch_size,
                       trackers=open_trackers(cfg, run_dir, is_writer, to_dict(cfg)))  # W&B / MLflow, as NeMo's

    def save(s: int) -> None:
        ckpt.save_checkpoint(ckpt_root, s, model, optimizer, scheduler, cfg, tokenizer.vocab_file, layout,
                             {"model_size": m.size_name(), "vocab_size": tokenizer.vocab_size,
                              "padded_vocab_size": padded, "compute_dtype": dtype_name(dtype),
                              "skipped_steps": state.skipped_steps, **origin})

    on_step = step_logger(t, runlog, optimizer, dtype, step, electra_loss.step_metrics, lambda: state.skipped_steps)
    electra = m.objective == "electra"
    state = LoopState(
        model=ddp, optimizer=optimizer, scheduler=scheduler,
        forward_step=(partial(electra_forward_step, seed=t.seed, weight=m.discriminator_loss_weight) if electra
                      else partial(forward_step, binary_head=m.bert_binary_head)),
        report_keys=electra_loss.REPORT_KEYS if electra else (),
        train_batches=data.train_microbatches, valid_batches=data.valid_microbatches,
        seq_length=m.encoder_seq_length, micro_batch_size=m.micro_batch_size, max_steps=t.max_steps, step=step,
        max_nonfinite_steps=t.max_nonfinite_steps, skipped_steps=skipped,
        hooks=loop_hooks(t, e, runlog, on_step, save))
    _announce(cfg, data.num_microbatches, dtype, step)
    if is_writer:  # the resolved config and what the run derived from it, as NeMo's hparams.yaml
        write_hparams(run_dir, to_dict(cfg), {
            "max_steps": t.max_steps, "start_step": step, "world_size": world.world_size,
            "data_parallel_size": ps.get_data_parallel_world_size(), "vocab_size": tokenizer.vocab_size,
            "padded_vocab_size": padded, "compute_dtype": dtype_name(dtype)})
    return run_steps(state, save, runlog, run_dir, ckpt_root, e.checkpoint_callback_params.save_last)
