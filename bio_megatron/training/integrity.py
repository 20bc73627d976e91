"""Checkpoint integrity (a sha256 per file, recorded at save time) and what loading a checkpoint trusts.

A checkpoint directory is checked *before* dist-checkpointing reads it, so that damage is reported as one
line naming the file, not as a traceback from halfway through a load:

1. ``checksums.json`` (written last, before the directory is renamed into place) lists every file with its
   size and sha256: a missing file, a different size (truncation) and a different digest (flipped bytes)
   are each named. Checkpoints written before checksums existed have no manifest; they are checked by 2-3.
2. ``.metadata`` is unpickled with an allow-list (:class:`_MetadataUnpickler`): torch's reader uses plain
   ``pickle``, so a crafted file could otherwise run code. Every shard it refers to must exist and be long
   enough.
3. Every pickled object stored in the shards (megatron's ``ShardedObject``: our RNG state, the common
   state, ``_extra_state``) must load with ``torch.load(weights_only=True)``; torch's load planner itself
   uses ``weights_only=False`` for them, so :func:`restricted_loading` forces the safe mode during the load.

Hashing is split across the ranks when a process group exists (rank r hashes every world-th file, largest
first) and the verdict is gathered, so every rank reaches the same decision.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from bio_megatron.parallel import seam
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import write_json_atomic
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
MANIFEST = "checksums.json"
MANIFEST_FORMAT = "bio_megatron-checksums/1"
METADATA = ".metadata"

# Everything torch's distributed-checkpoint Metadata is made of (torch/distributed/checkpoint/metadata.py,
# planner.py, filesystem.py), as found in checkpoints this project wrote at TP1, TP2, PP2 and with the
# distributed optimizer; megatron-core's torch_dist strategy adds only plain containers. torch dtypes are
# admitted by type (any ``torch.<name>`` that is a ``torch.dtype``).
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),  # looks a layout up by name in torch's own table
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id may be a path
}


def _object_globals() -> list:
    """What the objects we store need beyond torch's own weights-only allow-list: the numpy RNG state in our
    ``rng_state`` (an ``MT19937`` uint32 array). megatron-core registers the same at import; stating it here
    keeps the check independent of import order."""
    import numpy as np

    return [np._core.multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]


class UnsafePickle(pickle.UnpicklingError):
    """A pickle names a global outside the allow-list."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the classes a dist-checkpoint ``.metadata`` is made of."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                               torch.dtype)):
            return super().find_class(module, name)
        raise UnsafePickle(f"{module}.{name}")


def load_metadata_safely(fh: io.BufferedIOBase) -> Any:
    return _MetadataUnpickler(fh).load()


@contextlib.contextmanager
def restricted_loading() -> Iterator[None]:
    """During a dist-checkpointing load: ``.metadata`` through the allow-list and every ``torch.load``
    in weights-only mode (torch's ``DefaultLoadPlanner.load_bytes`` asks for ``weights_only=False``; the
    documented ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch overrides that). Checked beforehand too
    (:func:`check_structure`), so this is the second line, against a file swapped in between."""
    saved_env = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # torch refuses both set at once
    try:
        # torch's reader's ``pickle`` is the allow-list's (a row of the megatron-core seam)
        with seam.install("load", unpickler=_MetadataUnpickler), torch.serialization.safe_globals(_object_globals()):
            yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _digest(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        return {"size": size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}


def digest_files(directory: Path, names: list[str], collective: bool = True) -> dict[str, dict]:
    """``{name: {"size", "sha256"}}``; with ``collective`` (every rank calls it with the same names) the work
    is split across the ranks and the result gathered on all. sha256 runs at ~1 GB/s per core here."""
    rank, world = _rank_world() if collective else (0, 1)
    ordered = sorted(names, key=lambda n: (-(directory / n).stat().st_size, n))
    mine: dict[str, Any] = {}
    for name in ordered[rank::world]:
        try:
            mine[name] = _digest(directory / name)
        except OSError as exc:  # reported like a mismatch, after the gather, so that no rank is left waiting
            mine[name] = {"size": -1, "sha256": f"unreadable ({exc.strerror})"}
    if world == 1:
        return mine
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def write_manifest(directory: Path, digests: dict[str, dict]) -> None:
    """The manifest itself is written last: a directory with one has every file it lists complete."""
    write_json_atomic(directory / MANIFEST, {"format": MANIFEST_FORMAT, "algorithm": "sha256",
                                             "files": dict(sorted(digests.items()))})


def _read_manifest(directory: Path) -> dict[str, dict] | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"]
        well_formed = data.get("algorithm") == "sha256" and all(
            isinstance(v["size"], int) and isinstance(v["sha256"], str) for v in files.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        well_formed = False
    if not well_formed:
        raise CheckpointError(f"checkpoint {directory} is damaged: {MANIFEST} cannot be read")
    return files


def verify_checkpoint(directory: Path) -> None:
    """Raise :class:`CheckpointError` naming the checkpoint and the first damaged, missing or unsafe file.
    Collective when a process group exists: every rank must call it."""
    directory = Path(directory)
    recorded = _read_manifest(directory)
    if recorded is None:
        # Loaded, not refused: checkpoints saved before checksums existed would otherwise be stranded, and the
        # structural checks below still find truncation and refuse pickled code. It is never given a manifest
        # afterwards: nothing writes into an existing checkpoint directory, and a later save writes (and hashes)
        # every file of its own directory, recording where its state came from (``unverified_origin``).
        if _rank_world()[0] == 0:
            log.warning("checkpoint %s has no %s (saved before checksums were recorded, or removed): its files "
                        "cannot be verified; checking its structure only", directory, MANIFEST)
    else:
        for name, rec in sorted(recorded.items()):  # names and sizes first: cheap, and name a cut file at once
            path = directory / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
            size = path.stat().st_size
            if size != rec["size"]:
                raise CheckpointError(f"checkpoint {directory} is damaged: {name} has {size} bytes, "
                                      f"{rec['size']} were written (truncated or overwritten)")
        got = digest_files(directory, sorted(recorded))
        bad = [n for n in sorted(recorded) if got[n]["sha256"] != recorded[n]["sha256"]]
        if bad:
            more = f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else ""
            raise CheckpointError(f"checkpoint {directory} is damaged: {bad[0]} does not match the sha256 "
                                  f"recorded when it was saved{more}")
    check_structure(directory)


def check_structure(directory: Path) -> None:
    """``.metadata`` through the allow-list, every shard it names present and long enough, every pickled
    object in the shards loadable in weights-only mode."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    path = directory / METADATA
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory} is incomplete: {METADATA} is missing")
    try:
        with path.open("rb") as fh:
            meta = load_metadata_safely(fh)
    except UnsafePickle as exc:
        raise CheckpointError(f"checkpoint {directory}: {METADATA} names {exc}, which no checkpoint contains; "
                              "refusing to load it (the file may have been crafted to run code)") from None
    except Exception as exc:  # EOFError, UnpicklingError, ValueError...: a cut or scrambled pickle
        raise CheckpointError(f"checkpoint {directory} is damaged: {METADATA} cannot be read "
                              f"({type(exc).__name__}: {_first_line(exc)})") from None
    if not isinstance(meta, Metadata) or not isinstance(getattr(meta, "storage_data", None), dict):
        raise CheckpointError(f"checkpoint {directory} is damaged: {METADATA} holds a {type(meta).__name__}, "
                              "not torch distributed-checkpoint metadata")
    needed: dict[str, int] = {}
    for info in meta.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        shard = directory / name
        if not shard.is_file():
            raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
        if shard.stat().st_size < end:
            raise CheckpointError(f"checkpoint {directory} is damaged: {name} has {shard.stat().st_size} bytes, "
                                  f"{METADATA} says at least {end} (truncated)")
    objects = {k for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    for index, info in meta.storage_data.items():
        if index.fqn in objects and not info.transform_descriptors:
            with (directory / info.relative_path).open("rb") as fh:
                fh.seek(info.offset)
                _check_pickled(directory, info.relative_path, f"an object ({index.fqn})", fh.read(info.length))
    legacy = directory / "common.pt"  # older megatron-core kept the common state here; it still reads it
    if legacy.is_file():
        _check_pickled(directory, legacy.name, "the common state", legacy.read_bytes())


def _check_pickled(directory: Path, file: str, what: str, blob: bytes) -> None:
    """``torch.load(weights_only=True)`` of one stored object: the allow-list torch and megatron-core keep
    (``torch.serialization.add_safe_globals``; megatron-core registers its RNG/numpy types at import)."""
    try:
        with torch.serialization.safe_globals(_object_globals()):
            torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's weights-only unpickler refused something in it
        found = re.search(r"GLOBAL (\S+)", str(exc)) or re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(exc))
        why = f"names {found.group(1)}" if found and found.re.pattern.startswith("GLOBAL") else (
            f"the weights-only loader refuses ({found.group(1).strip() if found else _first_line(exc)})")
        raise CheckpointError(f"checkpoint {directory}: {file} holds {what} that {why}; refusing to load it "
                              "(damaged, or crafted to run code)") from None
    except Exception as exc:
        raise CheckpointError(f"checkpoint {directory} is damaged: {file} holds {what} that cannot be read "
                              f"({type(exc).__name__})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
