"""A checkpoint folder on disk, as the savers and loaders of ``training/checkpoint.py`` leave and find it: the
iteration folders and ``latest``, ``bio_megatron.json``, verification against ``checksums.json`` (once per process),
the folder automatic resume continues from (the newest intact one), the provenance of never-verified state, saves
left incomplete, and a run's ``status.json``. Nothing here reads tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch.distributed as dist

from bio_megatron.training import integrity
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def iteration_dir(root: Path, step: int) -> Path:
    return root / f"iter_{step:07d}"


def latest_checkpoint(root: Path) -> Path | None:
    """The directory named by ``root/latest``, or None when there is no checkpoint yet."""
    marker = root / "latest"
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker}: expected an iteration number, found {text!r}")
    path = iteration_dir(root, int(text))
    if not (path / "bio_megatron.json").is_file():
        raise CheckpointError(f"{marker} names {path}, which is missing or incomplete (no bio_megatron.json)")
    return path


def read_metadata(path: str | Path) -> dict:
    """``bio_megatron.json`` of a checkpoint directory (also accepts a run's ``checkpoints`` folder or run dir)."""
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if (candidate / "latest").exists():
            found = latest_checkpoint(candidate)
            if found:
                path = found
                break
    meta = path / "bio_megatron.json"
    if not meta.is_file():
        raise CheckpointError(f"{path}: not a BioMegatron checkpoint (no bio_megatron.json); expected a directory "
                              "like <run>/checkpoints/iter_0000100 or a run's checkpoints folder")
    try:
        data = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{meta}: unreadable ({exc})") from None
    data["path"] = str(path)
    return data


def remove_stale_saves(root: Path) -> None:
    """Delete ``.iter_*.tmp`` directories left by saves that never completed (rank 0 only)."""
    if root.is_dir() and (not dist.is_initialized() or dist.get_rank() == 0):
        for stale in root.glob(".iter_*.tmp"):
            log.warning("removing incomplete checkpoint save %s", stale)
            shutil.rmtree(stale, ignore_errors=True)


_VERIFIED: set[tuple[str, int]] = set()


def verify(path: Path) -> None:
    """:func:`integrity.verify_checkpoint` once per checkpoint (and manifest version) in this process:
    automatic resume verifies before choosing, the load that follows need not hash again."""
    manifest = Path(path) / integrity.MANIFEST
    key = (str(Path(path).resolve()), manifest.stat().st_mtime_ns if manifest.is_file() else 0)
    if key not in _VERIFIED:
        integrity.verify_checkpoint(Path(path))
        _VERIFIED.add(key)


def find_resume_checkpoint(root: Path) -> Path | None:
    """The checkpoint automatic resume continues from: the one ``root/latest`` names, or, when that one is
    damaged, the newest earlier ``iter_*`` that verifies (each damaged one is reported as a warning).
    None when there is nothing to resume; :class:`CheckpointError` when no checkpoint is intact.
    Collective: every rank calls it (verification is shared), so all ranks pick the same directory."""
    root = Path(root)
    if not (root / "latest").exists():
        return None
    newest, problems = None, []
    try:
        newest = latest_checkpoint(root)
    except CheckpointError as exc:
        log.warning("%s; looking for an earlier intact checkpoint", exc)
        problems.append(str(exc))
    steps = sorted((int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit() and p.is_dir()),
                   reverse=True)
    candidates = ([newest] if newest else []) + [
        iteration_dir(root, s) for s in steps if newest is None or s < int(newest.name[5:])]
    for path in candidates:
        try:
            read_metadata(path)
            verify(path)
        except CheckpointError as exc:
            log.warning("not resuming from %s: %s", path.name, exc)
            problems.append(str(exc))
            continue
        if problems:
            log.warning("resuming from %s, the newest intact checkpoint", path)
        return path
    raise CheckpointError(f"{root}: no intact checkpoint to resume from ({problems[0] if problems else 'none'}); "
                          "move the directory away to start afresh")


def unverified_origin(path: Path) -> dict:
    """``{"unverified_origin": path}`` when the state loaded from ``path`` was never verified by checksums (it has
    no manifest, or came from such a checkpoint itself): saved in later checkpoints' ``bio_megatron.json``, so
    that their own manifest (which vouches for the bytes they wrote) does not hide where the state came from."""
    path = Path(path)
    if not (path / integrity.MANIFEST).is_file():
        return {"unverified_origin": str(path)}
    inherited = read_metadata(path).get("unverified_origin")
    return {"unverified_origin": inherited} if inherited else {}


def write_status(run_dir: Path, state: str, step: int) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_json_atomic(run_dir / "status.json", {"state": state, "step": step})
