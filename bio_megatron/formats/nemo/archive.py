"""Reading and writing the ``.nemo`` container itself: a tar of ``model_config.yaml``, the weights and the
artifacts (NeMo 2.4 ``SaveRestoreConnector``: ``tarfile.open(path, "w:")`` with ``arcname="."``; NeMo 1.x
wrote ``w:gz``). Artifacts are stored as ``<uuid hex>_<name>`` and the config refers to them as ``nemo:<that>``.

Weight layouts NeMo writes (``NLPSaveRestoreConnector.save_to``, ``inject_model_parallel_rank``)::

    model_weights.ckpt                               TP1 x PP1
    mp_rank_TT/model_weights.ckpt                    TP > 1, PP 1
    tp_rank_TT_pp_rank_PPP/model_weights.ckpt        PP > 1
    model_weights/                                   dist-checkpointing (``mcore_bert: true``)

Extraction happens only inside a temporary folder, and only after every member name has been checked:
no absolute names, no ``..``, no links or devices (tarfile's ``data`` filter applies as well); and after their
count and declared sizes have been checked against a bound derived from the model's shape
(:mod:`bio_megatron.formats.archives`).
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
import uuid
import zlib
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

import torch

from bio_megatron.formats.safe_load import safe_torch_load
from bio_megatron.formats.archives import ENV_LIMIT, MAX_MEMBERS, archive_limit
from bio_megatron.utils.errors import CheckpointError

CONFIG, WEIGHTS = "model_config.yaml", "model_weights.ckpt"
_SHARD = re.compile(r"^(?:mp_rank_(\d{2})|tp_rank_(\d{2})_pp_rank_(\d{3}))/model_weights\.ckpt$")


def _checked_members(tf: tarfile.TarFile, where: str, bound) -> list[tarfile.TarInfo]:
    """Every member header, read one at a time (never more than ``MAX_MEMBERS``), with its name, type and declared
    size checked as it is read, so that a bomb is refused at its header, before its data is read or inflated. The
    bound is ``$BIO_MEGATRON_ARCHIVE_LIMIT``, else ``bound(model_config)`` (bytes from the model's shape) once
    ``model_config.yaml`` has been read, else the default cap of :mod:`bio_megatron.formats.archives`."""
    members, total = [], 0
    limit, source, shaped = archive_limit(), "the cap of", False
    while True:
        try:
            m = tf.next()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise CheckpointError(f"{where}: damaged archive ({exc})") from None
        if m is None:
            return members
        if len(members) >= MAX_MEMBERS:
            raise CheckpointError(f"{where}: more than {MAX_MEMBERS} members; refusing it (a crafted archive?)")
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts:
            raise CheckpointError(f"{where}: refusing archive member {m.name!r} (absolute path or '..')")
        if not (m.isfile() or m.isdir()):
            raise CheckpointError(f"{where}: refusing archive member {m.name!r} (a link or special file)")
        total += m.size
        if m.size > limit or total > limit:
            what = f"member {m.name!r} declares {m.size}" if m.size > limit else f"its members declare {total}"
            raise CheckpointError(f"{where}: {what} bytes unpacked, more than {source} {limit} bytes; refusing it "
                                  f"(a crafted archive? set {ENV_LIMIT} to raise the bound)")
        members.append(m)
        derived = None if shaped or os.environ.get(ENV_LIMIT) else _config_bound(tf, m, bound)
        if derived is not None:
            limit, source, shaped = derived, "what this model's shape can take:", True
            if total > limit:
                raise CheckpointError(f"{where}: its members declare {total} bytes unpacked, more than {source} "
                                      f"{limit} bytes; refusing it (set {ENV_LIMIT} to raise the bound)")


def _config_bound(tf: tarfile.TarFile, m: tarfile.TarInfo, bound) -> int | None:
    """``bound(config)`` when ``m`` is the archive's top-level ``model_config.yaml`` (read only under 16 MiB)."""
    parts = [p for p in PurePosixPath(m.name).parts if p != "."]
    if bound is None or not m.isfile() or parts != [CONFIG] or m.size > 16 << 20:
        return None
    import yaml

    try:
        cfg = yaml.safe_load(tf.extractfile(m).read())
    except (yaml.YAMLError, tarfile.TarError, OSError, UnicodeDecodeError, zlib.error):
        return None  # the reader reports a broken config with its own message
    return bound(cfg) if isinstance(cfg, dict) else None


@contextmanager
def extracted(path: str | Path, bound=None) -> Iterator[Path]:
    """The archive unpacked into a temporary folder (removed afterwards), after every member header has passed
    :func:`_checked_members` (``bound``: model config -> bytes, see there): a tar bomb is refused after reading
    headers only, with nothing unpacked."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (expected a .nemo archive)")
    try:
        tf = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"{path}: not a .nemo archive (a tar file): {exc}") from None
    with tf:
        members = _checked_members(tf, str(path), bound)
        with tempfile.TemporaryDirectory(prefix="bio_megatron_nemo_") as tmp:
            try:
                tf.extractall(tmp, members=members, filter="data")
            except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                raise CheckpointError(f"{path}: cannot unpack ({exc})") from None
            yield Path(tmp)


def artifact(root: Path, ref: object, where: str) -> Path | None:
    """The file a config value names: ``nemo:<name>`` inside the archive, else a bare name found in it."""
    if not isinstance(ref, str) or not ref:
        return None
    name = ref.split("nemo:", 1)[1] if ref.startswith("nemo:") else PurePosixPath(ref).name
    found = root / name
    if not found.is_file() or PurePosixPath(name).name != name:
        if ref.startswith("nemo:"):
            raise CheckpointError(f"{where}: model_config.yaml names {ref!r}, which the archive does not hold")
        return None
    return found


def find_artifact(root: Path, suffix: str) -> Path | None:
    """An artifact by its original name (``<hash>_vocab.txt`` or ``vocab.txt``), when the config names none."""
    hits = sorted(p for p in root.iterdir() if p.is_file() and (p.name == suffix or p.name.endswith("_" + suffix)))
    return hits[0] if len(hits) == 1 else None


def weight_files(root: Path, where: str) -> tuple[str, dict[tuple[int, int], Path] | Path]:
    """("legacy", {(tp, pp): file}) or ("dist", folder) for the layouts in the module docstring."""
    if (root / WEIGHTS).is_file():
        return "legacy", {(0, 0): root / WEIGHTS}
    if (root / "model_weights").is_dir():
        return "dist", root / "model_weights"
    shards = {}
    for f in root.glob("*/" + WEIGHTS):
        m = _SHARD.match(f.relative_to(root).as_posix())
        if m:
            shards[(int(m.group(1) or m.group(2)), int(m.group(3) or 0))] = f
    if not shards:
        raise CheckpointError(f"{where}: no weights ({WEIGHTS}, mp_rank_TT/{WEIGHTS}, tp_rank_TT_pp_rank_PPP/"
                              f"{WEIGHTS} or a model_weights/ folder)")
    return "legacy", shards


def load_state(file: Path, where: str) -> dict:
    """One ``model_weights.ckpt`` (a plain state dict, or a Lightning checkpoint's ``state_dict``)."""
    sub = file.parent.name + "/" if file.parent.name.startswith(("mp_", "tp_")) else ""
    sd = safe_torch_load(file, f"{where}:{sub}{file.name}")
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise CheckpointError(f"{where}: {file.name} holds {type(sd).__name__}, not a state dict")
    return sd


def load_dist(folder: Path, where: str) -> dict[str, torch.Tensor]:
    """Every tensor of a dist-checkpointing folder, whole (one process), with the pickle allow-lists on."""
    from megatron.core import dist_checkpointing

    from bio_megatron.training.integrity import restricted_loading

    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    if not torch.distributed.is_initialized():  # `import nemo` and the source cache's child: no process group
        return _load_dist_single(folder, where)
    try:
        with restricted_loading():
            # megatron's load_plain_tensors builds its template with torch.empty(**properties), which this torch
            # refuses (``strides``): read torch_dist's tensor metadata and build the template here
            from torch.distributed.checkpoint import FileSystemReader
            from torch.distributed.checkpoint.metadata import TensorStorageMetadata

            meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
            template = {k: ShardedTensor.from_rank_offsets(k, torch.empty(tuple(t.size), dtype=t.properties.dtype),
                                                           replica_id=0)
                        for k, t in meta.items() if isinstance(t, TensorStorageMetadata)}
            return dist_checkpointing.load(template, str(folder), validate_access_integrity=False)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise CheckpointError(f"{where}: cannot read model_weights/ ({first[:200]})") from None


def _load_dist_single(folder: Path, where: str) -> dict[str, torch.Tensor]:
    """:func:`load_dist` in a process without a process group (megatron's ``dist_checkpointing.load`` needs one):
    torch's reader with ``no_dist``, as formats/megatron_lm/dist.py reads a torch_dist checkpoint."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from bio_megatron.training.integrity import restricted_loading

    try:
        with restricted_loading(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\.checkpoint")
            reader = dcp.FileSystemReader(str(folder))
            wanted = {k: torch.empty(tuple(t.size), dtype=t.properties.dtype)
                      for k, t in reader.read_metadata().state_dict_metadata.items()
                      if isinstance(t, TensorStorageMetadata)}
            dcp.load(wanted, storage_reader=reader, no_dist=True)
            return wanted
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise CheckpointError(f"{where}: cannot read model_weights/ ({first[:200]})") from None


def save_dist(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """Whole tensors as a torch_dist checkpoint (what NeMo writes for ``mcore_bert``), from one process."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from bio_megatron.parallel import seam
    from bio_megatron.training.checkpoint import shutdown_writer

    sharded = {k: ShardedTensor.from_rank_offsets(k, v, replica_id=0) for k, v in tensors.items()}
    folder.mkdir(parents=True)
    seam.install("save")  # write results through an in-process queue, as training/checkpoint.py saves
    try:
        strategy = dist_checkpointing.serialization.get_default_save_sharded_strategy("torch_dist")
        dist_checkpointing.save(sharded, str(folder), sharded_strategy=strategy)
    finally:
        shutdown_writer()


def unique_name(name: str) -> str:
    """NeMo's artifact naming: ``<uuid4 hex>_<basename>``."""
    return f"{uuid.uuid4().hex}_{name}"


def write_tar(src: Path, out: Path) -> None:
    """``src``'s files as a ``.nemo`` (uncompressed tar, members under ``./`` as NeMo 2.4 writes them)."""
    with tarfile.open(out, "w:") as tar:
        tar.add(str(src), arcname=".")
