"""Which checkpoint format a path holds, decided in one place from the files alone (nothing is read).

``detect`` answers one of :data:`FORMATS`; loading (``resolve_source``), the benchmark suites' ``--model`` and the
``import`` / ``export`` commands all ask it. It sits low in the layers (paths only) so that ``loading/`` can use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from bio_megatron.utils.errors import CheckpointError

Format = Literal["ours", "hf", "megatron-lm", "nemo"]
FORMATS: tuple[Format, ...] = ("ours", "hf", "megatron-lm", "nemo")
OURS_METADATA = "bio_megatron.json"     # beside every checkpoint of ours (training/checkpoint.py)
OURS_LATEST = "latest"                  # a checkpoints folder's pointer to its newest iter_NNNNNNN
MEGATRON_LM_TRACKER = "latest_checkpointed_iteration.txt"
FOREIGN: tuple[Format, ...] = ("megatron-lm", "nemo")  # other programs' formats: imported before use
_EXPECTED = ("expected a BioMegatron checkpoint (bio_megatron.json, or a run / checkpoints folder with 'latest'), "
             "a Hugging Face folder (config.json), a Megatron-LM checkpoint (latest_checkpointed_iteration.txt, "
             "or a single .pt / .zip file) or a .nemo file")


def detect(path: str | Path) -> Format:
    """The format of ``path``: ``ours`` (a checkpoint directory, its ``checkpoints`` folder or its run directory),
    ``hf`` (a folder with ``config.json``), ``megatron-lm`` (a folder with Megatron-LM's tracker file, or a single
    ``.pt`` / NGC ``.zip``) or ``nemo`` (a ``.nemo`` file). Anything else is one CheckpointError naming the path and
    what was expected."""
    path = Path(path)
    if path.is_file():
        if path.suffix == ".nemo":
            return "nemo"
        if path.suffix in (".pt", ".zip"):
            return "megatron-lm"
        raise CheckpointError(f"{path}: a file that is not a BioMegatron checkpoint or any known model format; "
                              f"{_EXPECTED}")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not found, so not a BioMegatron checkpoint or any known model format; "
                              f"{_EXPECTED}")
    if (path / OURS_METADATA).is_file() or any((d / OURS_LATEST).exists() for d in (path, path / "checkpoints")):
        return "ours"
    if (path / MEGATRON_LM_TRACKER).is_file():
        return "megatron-lm"
    if (path / "config.json").is_file():
        return "hf"
    raise CheckpointError(f"{path}: not a BioMegatron checkpoint or any known model format; {_EXPECTED}")


__all__ = ["FOREIGN", "FORMATS", "MEGATRON_LM_TRACKER", "Format", "detect"]
