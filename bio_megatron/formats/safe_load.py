"""``torch.load`` of checkpoints written by other programs, without running their pickled code.

A Megatron-LM ``model_optim_rng.pt`` is a pickle: besides tensors it holds the training ``args``
(``argparse.Namespace``), RNG states (numpy arrays) and, in older files, optimizer helpers such as
``megatron.fp16.loss_scaler.DynamicLossScaler`` or enums (``ModelType``). Unpickling with
``weights_only=False`` would import and call whatever the file names, so a crafted checkpoint could run
any code. Here every load goes through ``torch.load(weights_only=True)`` with an explicit allow-list:

- ``argparse.Namespace`` and the numpy pieces of an RNG state, which are plain data;
- any global under ``megatron.``, ``fp16.``, ``apex.``, ``nemo.`` or ``transformer_engine.`` is *replaced*
  by :class:`Inert`, our own record class that only stores its arguments and state: the named module is
  never imported and nothing it defines runs (these objects are training state we never use);
- anything else (``os.system``, ``builtins.open``, ...) is refused with a one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import argparse
import io
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from bio_megatron.formats.archives import check_zip_if_zip
from bio_megatron.utils.errors import CheckpointError

# Training-state objects of these projects are replaced by Inert records (their modules are never imported).
_INERT_PREFIXES = ("megatron.", "fp16.", "apex.", "nemo.", "transformer_engine.")
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


class Inert:
    """Stands in for a pickled Megatron/NeMo training object (loss scaler, enum, config): keeps what the
    pickle gives it and does nothing else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"Inert({getattr(self, 'qualname', '?')})"


def _inert_class(name: str) -> type:
    # one subclass per name: the unpickler allow-list is keyed by class identity
    return type(name.rsplit(".", 1)[-1], (Inert,), {"qualname": name})


def _numpy_allowed() -> list:
    import numpy as np

    allowed: list = [np.ndarray, np.dtype, (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
                     np._core.multiarray._reconstruct, (np._core.multiarray.scalar, "numpy.core.multiarray.scalar"),
                     np._core.multiarray.scalar]
    # numpy >= 1.25 pickles the dtype of an array as numpy.dtypes.<Kind>DType
    allowed += [type(np.dtype(t)) for t in ("uint32", "int32", "int64", "uint8", "float32", "float64", "bool")]
    return allowed


def _globals_of(data: Any) -> list[str] | None:
    """Globals a torch zip-format file names, read without unpickling (None for the legacy format)."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = io.BytesIO(data)
        if not zipfile.is_zipfile(data):
            return None
        if isinstance(data, io.BytesIO):
            data.seek(0)
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(data))
    except Exception:  # not a torch zip file: the unpickler below reports it
        return None
    finally:
        if isinstance(data, io.BytesIO):
            data.seek(0)


def _check_name(name: str, where: str) -> None:
    if not name.startswith(_INERT_PREFIXES):
        raise CheckpointError(f"{where}: refusing to load: the file would call {name} while unpickling "
                              "(only tensors, argparse.Namespace, numpy RNG state and Megatron/NeMo training "
                              "objects are accepted)")


def safe_torch_load(source: str | Path | io.BytesIO, where: str | None = None, limit: int | None = None) -> Any:
    """``torch.load(source, weights_only=True)`` with the allow-list above; CheckpointError otherwise. A zip-format
    file's records are checked first against ``limit`` bytes (:func:`bio_megatron.formats.archives.check_zip`):
    torch allocates each record at the size its zip entry declares."""
    where = where or str(source)
    base = [argparse.Namespace, *_numpy_allowed()]
    inert: dict[str, type] = {}
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise CheckpointError(f"{where}: file not found")
    check_zip_if_zip(source, where, limit)
    names = _globals_of(source if isinstance(source, io.BytesIO) else str(source))
    allowed_names = {f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', '')}" for o in base
                     if not isinstance(o, tuple)} | {o[1] for o in base if isinstance(o, tuple)}
    for name in names or []:
        if name not in allowed_names:
            _check_name(name, where)
            inert[name] = _inert_class(name)
    for _ in range(64):  # legacy (non-zip) files: learn the Megatron names one refusal at a time
        if isinstance(source, io.BytesIO):
            source.seek(0)
        try:
            with torch.serialization.safe_globals(base + [(cls, n) for n, cls in inert.items()]):
                return torch.load(source, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError ... for bad files
            found = _UNSUPPORTED.search(str(exc))
            if found is None or found.group(1) in inert:
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
                raise CheckpointError(f"{where}: not a readable torch checkpoint ({first[:200]})") from None
            _check_name(found.group(1), where)
            inert[found.group(1)] = _inert_class(found.group(1))
    raise CheckpointError(f"{where}: too many Megatron objects in the pickle")
