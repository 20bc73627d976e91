"""Throughput accounting (tokens/s, model TFLOP/s, MFU) and the run's step log, metrics.jsonl and TensorBoard."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

# Dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets; MFU is reported
# only where the device is known. `bio-megatron bench` also measures the achievable matmul peak.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0,
               "B200": 2250.0}


def flops_per_sequence(shape: ModelShape, seq: int, vocab: int, training: bool = True) -> float:
    """Matmul FLOPs of one sequence through Megatron BERT (x3 for forward+backward when training)."""
    h, f, layers = shape.hidden_size, shape.ffn_hidden_size, shape.num_layers
    per_token_layer = 2 * (4 * h * h + 2 * h * f) + 2 * 2 * seq * h  # projections + QK^T and AV
    per_token_head = 2 * (h * h + h * vocab)  # LM-head transform + output projection
    fwd = seq * (layers * per_token_layer + per_token_head)
    return 3.0 * fwd if training else fwd


def device_peak_tflops(dtype: torch.dtype) -> float | None:
    if not torch.cuda.is_available() or dtype == torch.float32:
        return None
    name = torch.cuda.get_device_name()
    for key, peak in PEAK_TFLOPS.items():
        if key in name:
            return peak
    return None


def memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / 2**30


# Our record keys -> the scalar names NeMo (PyTorch Lightning) logs, so that TensorBoard dashboards and
# scripts written for NeMo runs read ours unchanged; keys not listed keep their own name.
NEMO_TAGS = {"loss": "reduced_train_loss", "step_time_s": "train_step_timing", "lr": "lr", "val_loss": "val_loss",
             "grad_norm": "grad_norm"}


class TensorBoardLog:
    """Scalars under NeMo's tag names in ``log_dir`` (rank 0 only: ``enabled`` False elsewhere)."""

    def __init__(self, log_dir: Path, enabled: bool, samples_per_step: int | None = None):
        self.samples_per_step = samples_per_step
        self._tb = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, step: int, values: dict, train: bool = False) -> None:
        """``values`` by our names (NaN/Inf and non-numbers skipped); ``train`` adds NeMo's ``global_step``
        and ``consumed_samples`` for this step."""
        if self._tb is None:
            return
        if train:
            values = {**values, "global_step": step}
            if self.samples_per_step:
                values["consumed_samples"] = step * self.samples_per_step
        for k, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self._tb.add_scalar(NEMO_TAGS.get(k, k), v, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class MetricsWriter:
    """A run folder's ``metrics.jsonl`` (one JSON object per record, appended, flushed) and its TensorBoard
    scalars (NeMo's tag names), written by the one process given ``enabled``. ``fresh``: start a new
    ``metrics.jsonl`` (a run that does not resume must not inherit an earlier attempt's records). ``trackers``
    (:func:`bio_megatron.training.trackers.open_trackers`): W&B / MLflow get every record too."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, samples_per_step: int | None = None,
                 fresh: bool = False, trackers=None):
        self._jsonl = None
        self.trackers = trackers
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(run_dir / "metrics.jsonl", "w" if fresh else "a", encoding="utf-8")
        self.tb = TensorBoardLog(run_dir / "tensorboard", enabled and tensorboard, samples_per_step)

    def write(self, rec: dict, tensorboard: dict | None = None) -> None:
        """``rec`` (with ``step``) to metrics.jsonl; to TensorBoard ``tensorboard`` if given, else ``rec``'s
        numbers (a record with ``loss`` is a training step: NeMo's ``global_step`` and ``consumed_samples``)."""
        # NaN/Inf are not JSON: a non-finite loss is written as null (the record's "nonfinite" flag says why).
        rec = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        if self._jsonl:
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()
        values = tensorboard if tensorboard is not None else \
            {k: v for k, v in rec.items() if k not in ("step", "nonfinite")}
        self.tb.scalars(rec["step"], values, train="loss" in rec)
        if self.trackers is not None:
            self.trackers.log(rec["step"], {k: v for k, v in rec.items() if k not in ("step", "nonfinite")})

    def close(self, failed: bool = False) -> None:
        if self._jsonl:
            self._jsonl.close()
            self._jsonl = None
        self.tb.close()
        if self.trackers is not None:
            self.trackers.close(failed)
            self.trackers = None


class RunLogFile:
    """The project logger's records also go to ``path`` (appended: a resumed run continues its log) while the
    run lasts; rank 0 only (``enabled``), in the stderr line format with the date."""

    def __init__(self, path: Path, enabled: bool):
        import logging

        self._handler = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.FileHandler(path, mode="a", encoding="utf-8")
            self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                                         "%Y-%m-%d %H:%M:%S"))
            self._logger = logging.getLogger("bio_megatron")
            self._handler.setLevel(self._logger.level)
            self._logger.addHandler(self._handler)

    def __enter__(self) -> "RunLogFile":
        return self

    def __exit__(self, *exc) -> None:
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None


def write_hparams(run_dir: Path, cfg_dict: dict, derived: dict) -> Path:
    """``hparams.yaml`` as NeMo (Lightning's ``save_hyperparameters``) writes it: the model block under ``cfg``,
    beside it the rest of the resolved config (``trainer``, ``exp_manager``, ...) and ``derived``: values the run
    computed (total steps, steps per epoch, world and data-parallel size, ...). Written atomically."""
    import yaml

    from bio_megatron.utils.io import atomic_open

    doc = {"cfg": cfg_dict.get("model", {}), **{k: v for k, v in cfg_dict.items() if k != "model"},
           "derived": derived}
    path = run_dir / "hparams.yaml"
    with atomic_open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


def fmt_eta(seconds: float) -> str:
    """``H:MM:SS`` (negative -> 0)."""
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class RunLogger:
    """The fixed one-line step log on rank 0, plus ``metrics.jsonl`` and TensorBoard in the run directory."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, tokens_per_step: int,
                 flops_per_step: float, world_size: int, peak_tflops: float | None, max_steps: int,
                 samples_per_step: int | None = None, trackers=None):
        self.enabled = enabled
        self.tokens_per_step, self.flops_per_step = tokens_per_step, flops_per_step
        self.world_size, self.peak, self.max_steps = world_size, peak_tflops, max_steps
        self._t_last = time.perf_counter()
        self._step_last: int | None = None
        self._out = MetricsWriter(run_dir, enabled, tensorboard, samples_per_step, trackers=trackers)

    def start(self, step: int) -> None:
        self._t_last, self._step_last = time.perf_counter(), step

    def log_step(self, step: int, loss: float, lr: float, grad_norm: float | None, **extra: float) -> dict:
        now = time.perf_counter()
        steps = max(1, step - (self._step_last if self._step_last is not None else step - 1))
        dt = (now - self._t_last) / steps
        self._t_last, self._step_last = now, step
        tok_s = self.tokens_per_step / dt
        tflops = self.flops_per_step / dt / 1e12 / self.world_size  # per device
        rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_sec": tok_s,
               "tflops_per_device": tflops, "mfu": (tflops / self.peak) if self.peak else None,
               "step_time_s": dt, "memory_gib": memory_gib(), **extra}
        if self.enabled:
            mfu = f"{100 * rec['mfu']:.1f}%" if rec["mfu"] is not None else "n/a"
            gn = f"{grad_norm:.3f}" if grad_norm is not None else "n/a"
            # Skipped updates are part of the fixed line, so a diverging run is visible at a glance.
            skipped = (f" | NON-FINITE: update skipped ({extra.get('skipped_steps', 0)} skipped so far)"
                       if extra.get("nonfinite") else
                       f" | fp16 gradient overflow: update skipped ({extra.get('skipped_steps', 0)} skipped so far)"
                       if extra.get("overflow") else
                       f" | skipped {extra['skipped_steps']}" if extra.get("skipped_steps") else "")
            if extra.get("loss_scale") is not None:  # fp16 only: an overflow halves it and skips the update
                skipped = f" | loss_scale {extra['loss_scale']:.4g}{skipped}"
            log.info("step %d/%d | loss %.4f | lr %.3e | grad_norm %s | %s tok/s | %.2f TFLOP/s | MFU %s | "
                     "mem %.2f GiB | ETA %s%s", step, self.max_steps, loss, lr, gn, f"{tok_s:,.0f}", tflops, mfu,
                     rec["memory_gib"], fmt_eta(dt * (self.max_steps - step)), skipped)
            self.write(rec)
        return rec

    def log_validation(self, step: int, val_loss: float) -> None:
        if self.enabled:
            log.info("validation at step %d | val_loss %.4f", step, val_loss)
            self.write({"step": step, "val_loss": val_loss})

    def write(self, rec: dict) -> None:
        self._out.write(rec)

    def close(self, failed: bool = False) -> None:
        self._out.close(failed)
