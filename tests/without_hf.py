"""An environment without transformers, for the ``[hf]`` extra's tests: this venv's site-packages as a folder of
symbolic links to every entry but transformers' own (its package and its ``.dist-info``). A Python that reads this
folder instead of site-packages has no transformers at all: ``import transformers`` raises ModuleNotFoundError,
``importlib.util.find_spec`` returns None and ``importlib.metadata`` knows no such distribution, as on a machine
where it was never installed, while torch, megatron-core and the rest are the very files the suite runs."""

from __future__ import annotations

import sysconfig
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])


def site_without_transformers(dest: Path) -> Path:
    """``dest`` (created) holding a link to each entry of :data:`SITE` except transformers'."""
    dest.mkdir(parents=True)
    for entry in SITE.iterdir():
        if entry.name.lower().startswith(("transformers-", "transformers.")) or entry.name == "transformers":
            continue
        (dest / entry.name).symlink_to(entry)
    return dest
