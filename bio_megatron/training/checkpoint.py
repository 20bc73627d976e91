"""Checkpoints on megatron-core dist-checkpointing (``torch_dist``): save, resume, reshard.

Layout on disk (self-describing, loadable at any TP/PP layout)::

    <run>/checkpoints/iter_0000100/   dist-checkpoint shards + config.yaml, vocab.txt, bio_megatron.json
    <run>/checkpoints/latest          "100", replaced atomically after the directory is complete

A save goes to ``.iter_XXXXXXX.tmp`` and is renamed when every rank has written and ``checksums.json``
(sha256 of every file, :mod:`bio_megatron.training.integrity`) is in place, so a crash mid-save never
leaves a broken ``latest``. Every load verifies the directory first and reads it with pickle allow-lists;
automatic resume falls back to the previous intact checkpoint when the newest is damaged (finding and verifying
the folders: :mod:`bio_megatron.training.checkpoint_dir`). A save that runs out
of disk space removes its temporary directory and stops every rank with one line
(:mod:`bio_megatron.training.disk_full`); what a resumed run must share with its checkpoint is checked before
loading (:mod:`bio_megatron.training.resume_checks`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist
import yaml

from bio_megatron.config.loader import to_dict
from bio_megatron.families import family_of_model
from bio_megatron.parallel import dist_ckpt, seam
from bio_megatron.training import integrity
from bio_megatron.training.checkpoint_dir import iteration_dir, read_metadata, verify
from bio_megatron.training.disk_full import disk_full_after, no_space, no_space_error
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import atomic_open, atomic_path
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
# fully_sharded_model_space (megatron's default) is broken in 0.19.2; this one reshards across layouts.
DISTOPT_SHARDING = "fully_reshardable"
# Where megatron-core's optimizers save the fp32 main parameters, under the model tensor's key: the plain
# mixed-precision optimizer, and the distributed one with its fully_reshardable sharding.
MAIN_PARAM_PREFIXES = ("optimizer.state.fp32_param.", "optimizer.state.param.")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _in_process_write_queue() -> None:
    """dist-checkpointing's write results through an in-process queue, not a spawn ``multiprocessing.Manager``
    (:func:`bio_megatron.parallel.dist_ckpt.in_process_write_queue`; a row of the megatron-core seam)."""
    seam.install("save")


def shutdown_writer() -> None:
    """Forget the write-results queue (kept for the callers' clean-up paths; no process to stop)."""
    dist_ckpt.forget_write_queue()


@contextlib.contextmanager
def _quiet_sharded_tensor() -> Iterator[None]:
    """megatron-core's torch_dist strategy converts to torch's ShardedTensor, which warns on every save and
    load; the warning is for megatron-core, not for our users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor",
                                category=FutureWarning)
        yield


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    saved_on_gpu = state.get("cuda") is not None
    if saved_on_gpu != torch.cuda.is_available():
        # megatron's tracker holds CUDA generator states on a GPU and the CPU shim's CPU ones without one: neither
        # fits the other's generators (a GPU refuses "RNG state is wrong size"). The tracker keeps this run's seeding.
        log.warning("checkpoint saved on a %s, resumed on a %s: the dropout random streams restart from the seed, so "
                    "the run is not bit-identical to an uninterrupted one", "GPU" if saved_on_gpu else "CPU",
                    "CPU" if saved_on_gpu else "GPU")
        return
    if saved_on_gpu:
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


@dataclass
class Layout:
    tp: int
    pp: int
    dp: int
    distributed_optimizer: bool

    @classmethod
    def current(cls, distributed_optimizer: bool) -> "Layout":
        from megatron.core import parallel_state as ps

        return cls(ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                   ps.get_data_parallel_world_size(), distributed_optimizer)


def _sharded_state(model, optimizer, scheduler, step: int, is_loading: bool, with_optimizer: bool,
                   with_rng: bool, with_scheduler: bool = False) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    model_sd = model.sharded_state_dict()
    state = {"model": model_sd, "iteration": step}
    if with_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": DISTOPT_SHARDING})
        state["scheduler"] = scheduler.state_dict()
    elif with_scheduler:  # a plain dict in the common state: readable whatever the optimizer kind
        state["scheduler"] = scheduler.state_dict()
    if with_rng:
        pp, tp = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
        state["rng_state"] = ShardedObject(
            "rng_state", _rng_state(), (ps.get_pipeline_model_parallel_world_size(),
                                        ps.get_tensor_model_parallel_world_size()),
            (pp, tp), replica_id=ps.get_data_parallel_rank())
    return state


def _describe(directory: Path, cfg, vocab_file: str | Path, meta: dict, files: dict[str, str] | None = None) -> None:
    """What makes a checkpoint directory self-describing: resolved config, vocabulary, metadata; the model's
    family (``model.family``) recorded in both, decided once here for configs that leave it to inference."""
    saved = to_dict(cfg)
    family = family_of_model(cfg.model, vocab_file=vocab_file).name
    saved["model"]["family"], meta = family, {**meta, "family": family}
    (directory / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    if Path(vocab_file).name == "vocab.json":  # byte-level BPE (RoBERTa): its merges travel with it
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(Path(vocab_file).parent / name, directory / name)
    elif Path(vocab_file).suffix == ".model":  # ALBERT's SentencePiece model, under the name transformers reads
        shutil.copyfile(vocab_file, directory / "spiece.model")
    elif Path(vocab_file).name == "tokenizer.json":  # a one-file BPE tokenizer (ModernBERT's), kept as it is
        shutil.copyfile(vocab_file, directory / "tokenizer.json")
    else:
        shutil.copyfile(vocab_file, directory / "vocab.txt")
    for name, text in (files or {}).items():
        (directory / name).write_text(text, encoding="utf-8")
    (directory / "bio_megatron.json").write_text(json.dumps({"format": "bio_megatron/1", **meta}, indent=2) + "\n")


def _dist_save(state: dict, directory: Path) -> None:
    from megatron.core import dist_checkpointing

    _in_process_write_queue()
    strategy = dist_checkpointing.serialization.get_default_save_sharded_strategy("torch_dist")
    with _quiet_sharded_tensor():
        dist_checkpointing.save(state, str(directory), sharded_strategy=strategy)


def save_model_checkpoint(out: Path, model, cfg, vocab_file: str | Path, meta: dict,
                          files: dict[str, str] | None = None) -> Path:
    """A model-only checkpoint (iteration 0) written by one process, atomically (``import hf``)."""
    try:
        with atomic_path(out) as tmp:
            tmp.mkdir()
            _dist_save({"model": model.sharded_state_dict(), "iteration": 0}, tmp)
            _describe(tmp, cfg, vocab_file, {"iteration": 0, "model_only": True, **meta}, files)
            integrity.write_manifest(tmp, integrity.digest_files(tmp, sorted(os.listdir(tmp)), collective=False))
    finally:
        shutdown_writer()
    return Path(out)


def save_checkpoint(root: Path, step: int, model, optimizer, scheduler, cfg, vocab_file: str | Path,
                    layout: Layout, extra_meta: dict | None = None, with_optimizer: bool = True) -> Path:
    """Write ``root/iter_<step>`` on every rank and move ``root/latest`` to it. A full disk (or quota) is one-line
    :class:`CheckpointError` on every rank: the temporary directory is removed, ``latest`` is untouched.
    ``with_optimizer=False`` writes the weights and RNG state only (a checkpoint to predict or fine-tune from,
    a third of the size with Adam; it can be loaded ``model_only`` but not resumed)."""
    tmp = root / f".iter_{step:07d}.tmp"
    is_writer = not dist.is_initialized() or dist.get_rank() == 0
    try:
        return _save(root, step, tmp, is_writer, model, optimizer if with_optimizer else None, scheduler, cfg,
                     vocab_file, layout, extra_meta)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if no_space(exc) is None and not disk_full_after(exc, root, is_writer):
            raise
        if is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise no_space_error(root, step) from None


def _agree_on_failure(failed: OSError | None) -> None:
    """Rank 0 writes the description and the manifest alone: the others must learn that it ran out of space
    rather than wait for it at the next barrier."""
    flag = [failed is not None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(flag, src=0)
    if flag[0]:
        raise failed or OSError(errno.ENOSPC, "no space left on device (rank 0)")


def _save(root: Path, step: int, tmp: Path, is_writer: bool, model, optimizer, scheduler, cfg,
          vocab_file: str | Path, layout: Layout, extra_meta: dict | None) -> Path:
    final = iteration_dir(root, step)
    failed: OSError | None = None
    if is_writer:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)  # dist_checkpointing.save requires an existing, empty directory
        except OSError as exc:
            failed = no_space(exc)
            if failed is None:
                raise
    _agree_on_failure(failed)
    _dist_save(_sharded_state(model, optimizer, scheduler, step, False, optimizer is not None, True), tmp)
    _barrier()
    # Every rank hashes a share of the shards (page-cache hot: they were just written); rank 0 names them so
    # that all ranks agree on the list even where a shared file system lists lazily.
    names = [sorted(os.listdir(tmp)) if is_writer else None]
    if dist.is_initialized():
        dist.broadcast_object_list(names, src=0)
    digests = integrity.digest_files(tmp, names[0])
    if is_writer:
        try:
            _describe(tmp, cfg, vocab_file, {"iteration": step, "layout": layout.__dict__,
                                             "consumed_samples": step * cfg.model.global_batch_size,
                                             **(extra_meta or {})})
            described = sorted(set(os.listdir(tmp)) - set(digests))
            digests.update(integrity.digest_files(tmp, described, collective=False))
            integrity.write_manifest(tmp, digests)
        except OSError as exc:
            failed = no_space(exc)
            if failed is None:
                raise
    _agree_on_failure(failed)
    if is_writer:
        # Every file here was written by this save and hashed just now: a manifest never vouches for bytes
        # carried over from another directory (nothing is copied or linked from the checkpoint resumed from).
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        with atomic_open(root / "latest") as fh:
            fh.write(f"{step}\n")
    _barrier()
    log.info("saved checkpoint %s", final)
    return final


def load_sharded(path: Path, sharded_state_dict: dict) -> dict:
    """``dist_checkpointing.load`` of a verified checkpoint directory with the pickle allow-lists on; any
    failure (torch's ``CheckpointException`` is a BaseException) becomes one-line :class:`CheckpointError`."""
    from megatron.core import dist_checkpointing

    verify(path)
    try:
        with integrity.restricted_loading(), _quiet_sharded_tensor():
            return dist_checkpointing.load(sharded_state_dict, str(path))
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # torch/megatron raise many types for unreadable or mismatched shards
        raise CheckpointError(f"checkpoint {path}: cannot load it ({_failure(exc)})") from exc


def _failure(exc: BaseException) -> str:
    """One line for an exception; torch's CheckpointException wraps one failure per rank (with tracebacks)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = first[0] if isinstance(first, tuple) else first  # torch keeps (exception, traceback summary)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"


def load_checkpoint(path: Path, model, optimizer=None, scheduler=None, layout: Layout | None = None,
                    model_only: bool = False, compute_dtype: str | None = None) -> int:
    """Load a checkpoint into this layout; returns its iteration. Optimizer, scheduler and RNG come back
    when asked and possible (RNG only at the same TP/PP layout; optimizer only with the same optimizer kind
    and, given ``compute_dtype``, the same precision family: fp32, or bf16/fp16 with fp32 main parameters).
    Whenever the optimizer state is not loaded, a given ``optimizer`` re-reads its fp32 main parameters from
    the loaded weights (a mixed-precision optimizer would otherwise write its stale copies back at the next step)."""
    meta = read_metadata(path)
    path = Path(meta["path"])
    saved = meta.get("layout", {})
    with_opt = not model_only and optimizer is not None
    # Checkpoints written before the precision was recorded were all fp32 (CPU runs always were).
    saved_dtype = meta.get("compute_dtype", "float32")
    with_sched = False  # without the optimizer state, the LR schedule still carries over across precisions
    if compute_dtype is not None and saved_dtype != compute_dtype:
        mixed = {d: d != "float32" for d in (saved_dtype, compute_dtype)}
        if with_opt and mixed[saved_dtype] != mixed[compute_dtype]:
            log.warning("checkpoint %s was trained in %s, this run computes in %s: loading the model weights only "
                        "(converted to %s) and the LR schedule; the Adam state starts afresh, since "
                        "megatron-core's fp32 and mixed-precision optimizers keep different state", path, saved_dtype,
                        compute_dtype, compute_dtype)
            with_opt, with_sched = False, scheduler is not None
        else:
            log.warning("checkpoint %s was trained in %s, this run computes in %s: weights converted to %s",
                        path, saved_dtype, compute_dtype, compute_dtype)
    if with_opt and layout and saved.get("distributed_optimizer") != layout.distributed_optimizer:
        log.warning("checkpoint %s used %s optimizer, this run the %s one: loading model weights only "
                    "(megatron-core cannot convert between them)", path,
                    "the distributed" if saved.get("distributed_optimizer") else "a plain",
                    "distributed" if layout.distributed_optimizer else "plain")
        with_opt = False
    with_rng = (not model_only and layout is not None and saved.get("tp") == layout.tp
                and saved.get("pp") == layout.pp)
    if with_opt:
        _prime_adam_state(optimizer)
    sharded = _sharded_state(model, optimizer, scheduler, int(meta["iteration"]), True, with_opt, with_rng,
                             with_sched)
    if not with_opt and saved_dtype != "float32":
        from_main_params(sharded["model"], path)
    state = load_sharded(path, sharded)
    model.load_state_dict(state["model"], strict=True)
    if optimizer is not None and not with_opt:
        optimizer.reload_model_params()
    if with_opt:
        if hasattr(scheduler, "prepare_optimizer_state"):  # override_opt_param_scheduler: this run's group rates
            scheduler.prepare_optimizer_state(state["optimizer"])
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if with_rng and "rng_state" in state:
        _set_rng_state(state["rng_state"])
    return int(meta["iteration"])


def from_main_params(model_sd: dict, path: Path) -> None:
    """fp32 tensors of a model read from a bf16/fp16 checkpoint come from its fp32 main parameters (the exact
    trained values) rather than from their half-precision copies, wherever the checkpoint holds them."""
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from torch.distributed.checkpoint import FileSystemReader

    verify(path)  # checksums and the allow-listed .metadata first: read_metadata unpickles it
    with integrity.restricted_loading():
        saved = {k for k in FileSystemReader(str(path)).read_metadata().state_dict_metadata
                 if k.startswith(MAIN_PARAM_PREFIXES)}
    if not saved:
        return

    def swap(x):
        if isinstance(x, ShardedTensor) and x.data.dtype == torch.float32:
            main = next((p + x.key for p in MAIN_PARAM_PREFIXES if p + x.key in saved), None)
            if main is not None:
                x.key = main
        return x

    dict_list_map_inplace(swap, model_sd)


def _prime_adam_state(optimizer) -> None:
    """Allocate the inner torch Adam state of every (chained) optimizer before a load."""
    from bio_megatron.parallel.cpu_shim import prime_adam_state

    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        prime_adam_state(getattr(sub, "optimizer", None))


