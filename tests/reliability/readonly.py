"""A folder nobody can write into, root included (the test suite runs as root in CI).

``chmod 0555`` does not stop root, so as root the folder is made immutable (``chattr +i``), which the kernel
enforces for every user; where the file system has no such flag the test is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

# What the OS says when the write is refused: EACCES for a plain user, EPERM for an immutable folder.
REFUSED = ("Permission denied", "Operation not permitted")


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"running as root and cannot make {path} immutable: {done.stderr.strip() or 'no chattr'}")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
