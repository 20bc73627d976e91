"""Task-agnostic knowledge distillation (bio-lm §7): the student pretrains on the masked-LM data while a frozen
teacher runs forward on the same micro-batch in the same step (``training/distill_loss.py`` for the loss).

Everything else is pretraining's: the data pipeline, the shared loop (NaN guard, SIGTERM/SIGUSR1/Ctrl-C saves),
megatron DDP and optimizer, checkpoints with integrity and exact resume, metrics.jsonl / TensorBoard (each loss
term logged separately), the run-directory lock. The teacher is a plain module outside DDP and the optimizer: no
gradients, no optimizer state, its own precision; it is built by the caller's ``load_teacher`` (``loading/`` sits
above this layer: ``cli/distill.py`` hands :func:`bio_megatron.loading.teacher.load_teacher` down).

The saved student is an ordinary checkpoint of its family: the same keys as pretraining's, plus
``distill_projection.{weight,bias}`` only when the cosine term needs a projection (student narrower than the
teacher); loaders of the family ask for their own keys and ignore it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

import torch
from megatron.core import parallel_state as ps

from bio_megatron.config.distill import DistillConfig, validate_distill
from bio_megatron.config.loader import to_dict
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.data.pretrain import PretrainData, load_tokenizer
from bio_megatron.families import family_of_model
from bio_megatron.models.bert import describe_precision, dtype_name, precision_dtype
from bio_megatron.models.init import init_weights
from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
from bio_megatron.training import checkpoint as ckpt
from bio_megatron.training import checkpoint_dir as ckpt_dir
from bio_megatron.training import distill_loss, memory
from bio_megatron.training.disk_full import no_space
from bio_megatron.training.guards import run_dir_lock
from bio_megatron.training.loop import LoopState
from bio_megatron.training.metrics import RunLogger, device_peak_tflops, flops_per_sequence
from bio_megatron.training.optimizer import build_optimizer, build_scheduler
from bio_megatron.training.pretrain import (continued_from, load_continued, loop_hooks, run_steps, step_logger,
                                           to_device, wrap_for_training)
from bio_megatron.training.trackers import open_trackers
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
PROJECTION = "distill_projection"


def _capture_last_hidden(model: torch.nn.Module) -> dict:
    """The encoder's output [s, b, h] of the latest forward, kept by a hook (megatron's BertModel returns the
    logits only); the loss reads it as [b, s, h]."""
    box: dict = {}
    model.encoder.register_forward_hook(lambda module, args, output: box.__setitem__("hidden", output))
    return box


def distill_forward_step(data_iterator, model, *, student: torch.nn.Module, teacher: torch.nn.Module,
                         student_box: dict, teacher_box: dict, vocab_size: int, settings):
    """One micro-batch: the teacher forward (no grad), the student forward, the combined loss. In validation the
    reported loss is the student's masked-LM loss alone (comparable with pretraining's val_loss)."""
    b = to_device(next(data_iterator))
    s_logits, _ = model(b["text"], b["padding_mask"], tokentype_ids=b["types"])
    s_hidden = student_box["hidden"].transpose(0, 1)
    if not model.training:
        mlm = distill_loss.mlm_loss(s_logits, b["labels"], b["loss_mask"], vocab_size)
        return mlm, lambda output: (output, {"loss": mlm.detach().clone()})
    with torch.no_grad():
        t_logits, _ = teacher(b["text"], b["padding_mask"], tokentype_ids=b["types"])
    t_hidden = teacher_box["hidden"].transpose(0, 1)
    loss, report = distill_loss.distill_loss(s_logits, t_logits, s_hidden, t_hidden, b["labels"], b["loss_mask"],
                                             b["padding_mask"], vocab_size, settings,
                                             getattr(student, PROJECTION, None))
    return loss, lambda output: (output, report)


def build_student(cfg: DistillConfig, vocab_size: int, dtype: torch.dtype, teacher_hidden: int,
                  restore: Path | None) -> torch.nn.Module:
    """The student as pretraining builds it (layout-invariant init), its MLM-pretrained weights when restored,
    then the cosine term's projection (student -> teacher width) when the widths differ."""
    m = cfg.model
    model = family_of_model(m).build_pretraining_model(m, vocab_size, dtype)
    init_weights(model, cfg.trainer.seed, m.init_method_std, m.shape().num_layers)
    if restore is not None:  # before the projection exists: the checkpoint has none
        ckpt.load_checkpoint(restore, model, model_only=True, compute_dtype=dtype_name(dtype))
        log.info("student initialised from %s (as bio-lm: an MLM-pretrained student)", restore)
    width = m.shape().hidden_size
    if m.distill.alpha_cos and width != teacher_hidden:
        projection = torch.nn.Linear(width, teacher_hidden)
        g = torch.Generator().manual_seed(cfg.trainer.seed)  # the same on every rank: a replicated module
        with torch.no_grad():
            projection.weight.copy_(torch.randn(teacher_hidden, width, generator=g) * m.init_method_std)
            projection.bias.zero_()
        setattr(model, PROJECTION, projection.to(dtype))
        if torch.cuda.is_available():
            model.cuda(torch.cuda.current_device())
    return model


def run_distillation(cfg: DistillConfig, load_teacher: Callable) -> str:
    """Distil per ``cfg`` in this process (one rank of the world); ``load_teacher(cfg, vocab_file, vocab_size,
    precision)`` builds the teacher. Returns "finished" or "interrupted"; errors as ``run_pretraining``."""
    world = init_distributed()
    validate_distill(cfg, world.world_size)
    family_of_model(cfg.model)
    m, t = cfg.model, cfg.trainer
    init_model_parallel(m.tensor_model_parallel_size, 1, t.seed)
    tokenizer = load_tokenizer(cfg)
    # The teacher before the run directory: a teacher that does not load or does not fit the student stops the
    # run with nothing written.
    teacher = load_teacher(cfg, tokenizer.vocab_file, tokenizer.vocab_size, t.precision)
    with run_dir_lock(cfg.run_dir, f"run directory {cfg.run_dir}", command="distill"):
        try:
            return _distill(cfg, world, tokenizer, teacher)
        except OSError as exc:
            if no_space(exc) is None:
                raise
            raise CheckpointError(f"no space left on {exc.filename or cfg.run_dir} (run directory {cfg.run_dir}); "
                                  "free space, then run the same command to resume from checkpoints/latest") from None


def _distill(cfg: DistillConfig, world, tokenizer, teacher: torch.nn.Module) -> str:
    m, t, e = cfg.model, cfg.trainer, cfg.exp_manager
    dtype = precision_dtype(t.precision)
    run_dir, ckpt_root = cfg.run_dir, cfg.run_dir / "checkpoints"
    padded = padded_vocab_size(tokenizer.vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    teacher_hidden = teacher.config.hidden_size
    resume, restore = continued_from(cfg, tokenizer)
    if resume is not None:
        _warn_changed_distillation(resume, cfg)
    elif restore is not None:
        restore = Path(ckpt_dir.read_metadata(restore)["path"])
    if not t.skip_memory_check:
        memory.check_fits(m, padded, dtype, ps.get_data_parallel_world_size())
    data = PretrainData(cfg, tokenizer, ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(),
                        Path(m.data.index_mapping_dir or run_dir / "index_cache"))
    model = build_student(cfg, tokenizer.vocab_size, dtype, teacher_hidden, restore)
    student_box, teacher_box = _capture_last_hidden(model), _capture_last_hidden(teacher)
    ddp = wrap_for_training(model, m, dtype)
    optimizer = build_optimizer(m.optim, [ddp], dtype, t.gradient_clip_val, m.use_distributed_optimizer, m)
    scheduler = build_scheduler(optimizer, m.optim, t.max_steps)
    layout = ckpt.Layout.current(m.use_distributed_optimizer)
    step, skipped, origin = load_continued(resume, None, model, optimizer, scheduler, layout, dtype)

    # the teacher's forward counts as a third of its training FLOPs (no backward)
    flops = (flops_per_sequence(m.shape(), m.encoder_seq_length, padded)
             + flops_per_sequence(_shape_of(teacher.config), m.encoder_seq_length, padded) / 3)
    tokens = m.global_batch_size * m.encoder_seq_length
    runlog = RunLogger(run_dir, world.rank == 0, e.create_tensorboard_logger, tokens, m.global_batch_size * flops,
                       world.world_size, device_peak_tflops(dtype), t.max_steps, samples_per_step=m.global_batch_size,
                       trackers=open_trackers(cfg, run_dir, world.rank == 0, to_dict(cfg)))

    def save(s: int) -> None:
        ckpt.save_checkpoint(ckpt_root, s, model, optimizer, scheduler, cfg, tokenizer.vocab_file, layout,
                             {"model_size": m.size_name(), "vocab_size": tokenizer.vocab_size,
                              "padded_vocab_size": padded, "compute_dtype": dtype_name(dtype),
                              "skipped_steps": state.skipped_steps,
                              "distilled_from": str(m.teacher.restore_from_path), **origin})

    on_step = step_logger(t, runlog, optimizer, dtype, step, distill_loss.step_metrics, lambda: state.skipped_steps)
    state = LoopState(
        model=ddp, optimizer=optimizer, scheduler=scheduler,
        forward_step=partial(distill_forward_step, student=model, teacher=teacher, student_box=student_box,
                             teacher_box=teacher_box, vocab_size=tokenizer.vocab_size, settings=m.distill),
        report_keys=distill_loss.REPORT_KEYS, train_batches=data.train_microbatches,
        valid_batches=data.valid_microbatches, seq_length=m.encoder_seq_length, micro_batch_size=m.micro_batch_size,
        max_steps=t.max_steps, step=step, max_nonfinite_steps=t.max_nonfinite_steps, skipped_steps=skipped,
        hooks=loop_hooks(t, e, runlog, on_step, save))
    d = m.distill
    log.info("distilling into %s (%d layers, hidden %d) | TP %d DP %d (teacher: the same layout) | %d micro-batch(es) "
             "of %d per step | student %s | loss = %g x MLM + %g x KL(T=%g%s, %s positions) + %g x cosine%s | from "
             "step %d to %d", m.size, m.shape().num_layers, m.shape().hidden_size, m.tensor_model_parallel_size,
             ps.get_data_parallel_world_size(), data.num_microbatches, m.micro_batch_size, describe_precision(dtype),
             d.alpha_mlm, d.alpha_kl, d.temperature, ", x T^2" if d.kl_t2_scaling else "", d.kl_positions,
             d.alpha_cos, " (through a projection)" if hasattr(model, PROJECTION) else "", step, t.max_steps)
    return run_steps(state, save, runlog, run_dir, ckpt_root, e.checkpoint_callback_params.save_last)


def _warn_changed_distillation(resume: Path, cfg: DistillConfig) -> None:
    """A resumed run may change its teacher or loss (a deliberate second phase), but never silently: say which."""
    from bio_megatron.formats.saved import saved_model_config

    saved = saved_model_config(resume)  # the one reader of a checkpoint's config.yaml
    now = to_dict(cfg.model)
    for block in ("teacher", "distill"):
        for key, value in now[block].items():
            old = (saved.get(block) or {}).get(key, value)
            if old != value:
                log.warning("model.%s.%s is %r in this run, %r in the checkpoint %s resumes from: the loss changes "
                            "from here on", block, key, value, old, resume)


def _shape_of(config):
    """A megatron TransformerConfig as the ModelShape ``flops_per_sequence`` reads."""
    from bio_megatron.config.sizes import ModelShape

    return ModelShape(num_layers=config.num_layers, hidden_size=config.hidden_size,
                      num_attention_heads=config.num_attention_heads, ffn_hidden_size=config.ffn_hidden_size,
                      status="custom")
