"""The suite folder: its manifest (model, options, suite version), the plan of its cells, and the model a
NeMo / Megatron-LM source is imported to once.

A folder holds the results of exactly one set of options: a rerun with others is refused, naming what
differs, unless ``--overwrite`` (which removes the earlier suite's outputs and starts over). Array tasks of
one SLURM job open the folder concurrently; the manifest and the model import happen under a blocking lock,
so the first one writes them and the others wait and reuse them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from bio_megatron import __version__
from bio_megatron.benchmark.plan import Plan
from bio_megatron.benchmark.report import MANIFEST, PLAN
from bio_megatron.benchmark.suites import SUITES
from bio_megatron.utils.errors import CheckpointError, ConfigError, OutputError
from bio_megatron.utils.io import load_json, write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
FOREIGN = ("nemo", "megatron-lm")
# What resolve_world reads: a child started from inside a SLURM step or torchrun must be a world of its own.
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
# Everything a suite writes at its top level (removed by --overwrite; other files make the folder foreign).
OWN = (MANIFEST, PLAN, "cells", "model", "model.log", "results.json", "results.md", ".manifest.lock", "suite.lock")


def model_kind(model: str) -> str:
    """``checkpoint`` (ours), ``hf``, ``nemo`` or ``megatron-lm``; a path that is none of them is refused."""
    from bio_megatron.formats.detect import detect

    path = Path(model)
    if not path.exists():
        raise ConfigError(f"--model {model}: not found; expected a BioMegatron checkpoint (or run / checkpoints "
                          "folder), a Hugging Face folder, a .nemo file or a Megatron-LM checkpoint")
    kind = detect(path)
    return "checkpoint" if kind == "ours" else kind


def restore_path(out: Path, model: str, kind: str) -> str:
    """What every stage-0 cell restores from: the model itself, or its import in the suite folder."""
    return str(out / "model") if kind in FOREIGN else model


def fingerprint(path: Path) -> str:
    """Names, sizes and modification times of the model's files: cells of another model are not reused."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if f != path else f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


@contextlib.contextmanager
def manifest_lock(out: Path) -> Iterator[None]:
    """Blocking: concurrent array tasks queue here (utils.lock fails at once, which is for rival writers)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".manifest.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _differences(old: dict, new: dict) -> list[str]:
    diffs = [f"{k}: {old.get(k)!r} (this run: {new[k]!r})" for k in ("suite", "suite_version", "model",
                                                                         "model_fingerprint") if old.get(k) != new[k]]
    o, n = old.get("options", {}), new["options"]
    return diffs + [f"{k}: {o.get(k)!r} (this run: {n[k]!r})" for k in n if o.get(k) != n[k]]


def differences(out: Path, plan: Plan, kind: str) -> list[str]:
    """What a run of ``plan`` would find different in the manifest of ``out`` (empty: none, or no manifest)."""
    path = out / MANIFEST
    return _differences(load_json(path), _manifest(plan, kind)) if path.is_file() else []


def _manifest(plan: Plan, kind: str) -> dict:
    opts = plan.options
    return {"suite": opts.suite, "suite_version": SUITES[opts.suite].version, "model": opts.model,
            "model_kind": kind, "model_fingerprint": fingerprint(Path(opts.model)), "options": opts.identity(),
            "bio_megatron_version": __version__}


def _clear(out: Path) -> None:
    for name in OWN:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif name not in (".manifest.lock", "suite.lock") and (p.exists() or p.is_symlink()):
            p.unlink()


def open_suite(plan: Plan, kind: str, overwrite: bool = False) -> None:
    """Create or check the manifest of ``plan.out`` (refusing other options unless ``overwrite``), import a
    foreign model once, and record the plan's cells in ``plan.json``."""
    out, opts = plan.out, plan.options
    new = _manifest(plan, kind)
    with manifest_lock(out):
        path = out / MANIFEST
        if path.is_file():
            diffs = _differences(load_json(path), new)
            if diffs and not overwrite:
                raise ConfigError([f"{out} holds a suite run with other settings; pass --overwrite to start over "
                                   "there, or choose another --out:"] + diffs)
            if overwrite:
                log.info("--overwrite: removing the earlier suite's outputs in %s", out)
                _clear(out)
        else:
            foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN)
            if foreign:
                raise OutputError(f"{out}: not empty and not a benchmark suite folder (holds "
                                  f"{', '.join(foreign[:5])}); choose a new or empty folder for --out")
        if not path.is_file():
            write_json_atomic(path, new)
        if kind in FOREIGN:
            _import_model(out, opts.model, kind)
        write_json_atomic(out / PLAN, plan_record(plan))


def plan_record(plan: Plan) -> dict:
    return {"cells": [{"index": c.index, "dataset": c.dataset.key, "seed": c.seed,
                       "point": list(c.point) if c.point else None, "dir": str(c.dir.relative_to(plan.out)),
                       "stage": c.stage, "after": c.after.index if c.after else None, "missing": c.missing,
                       "command": ["bio-megatron", *c.finetune_args()]} for c in plan.cells]}


def _import_model(out: Path, model: str, kind: str) -> None:
    """``bio-megatron import nemo|megatron-lm`` into ``<out>/model``, once (its output is written atomically)."""
    target = out / "model"
    if (target / "bio_megatron.json").is_file():
        return
    flag = "--model" if kind == "nemo" else "--checkpoint"
    cmd = [sys.executable, "-m", "bio_megatron", "import", kind, flag, model, "--out", str(target), "--overwrite"]
    log.info("importing %s (%s) once into %s: %s", model, kind, target, " ".join(cmd))
    env = {k: v for k, v in os.environ.items() if k not in WORLD_VARS}
    with open(out / "model.log", "w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (out / "model.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise CheckpointError(f"--model {model}: `bio-megatron import {kind}` failed (exit {rc}): "
                              f"{tail[0] if tail else ''} (log: {out / 'model.log'})")
