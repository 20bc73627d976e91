"""The config saved beside each of our checkpoints (``config.yaml``), read in one place.

Loading, export and import all take a checkpoint's shape, binary head, casing and task settings from here. It sits
low in the layers (it needs only YAML and the error classes) so that ``loading/`` shares it with the writers above.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bio_megatron.utils.errors import CheckpointError

CONFIG_FILE = "config.yaml"


def saved_config(checkpoint: str | Path) -> dict:
    """The resolved config saved beside one of our checkpoints (``<checkpoint>/config.yaml``), as a dict: the one
    reader of that file for loading, export and import. Unreadable YAML or a non-mapping is a CheckpointError
    naming the file."""
    file = Path(checkpoint) / CONFIG_FILE
    try:
        cfg = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{file}: cannot be read ({exc.__class__.__name__}): the checkpoint's saved config "
                              "is expected there") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: a mapping of config sections is expected, not {type(cfg).__name__}")
    return cfg


def saved_model_config(checkpoint: str | Path) -> dict:
    """The ``model`` section of :func:`saved_config` (empty when absent)."""
    model = saved_config(checkpoint).get("model") or {}
    if not isinstance(model, dict):
        raise CheckpointError(f"{Path(checkpoint) / CONFIG_FILE}: model: a mapping is expected, not "
                              f"{type(model).__name__}")
    return model
