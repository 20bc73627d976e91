"""Modes of an exported folder: readable by group and others, as ``save_pretrained`` output is expected to be.

transformers 5 writes ``model.safetensors`` through a private temporary file (mode 0600), so on a shared cluster
colleagues could read a folder's config but not its weights. Every file of an export is set to
``0o666 & ~umask`` and every folder to ``0o777 & ~umask``: 0644 / 0755 under the usual umask 022, and
whatever a stricter umask (077: 0600 / 0700) says, so a user who wants private files still gets them.
"""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """This process's umask, read without changing it where Linux says it (``/proc/self/status``, 4.7+)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: the classic set-and-restore (not thread-safe, but export is one thread)
    os.umask(mask)
    return mask


def apply_umask_modes(root: str | Path) -> None:
    """``root`` and everything under it: files ``0o666 & ~umask``, folders ``0o777 & ~umask`` (links untouched)."""
    mask = current_umask()
    root = Path(root)
    os.chmod(root, 0o777 & ~mask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o777 & ~mask)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)
