"""What the reliability tests compare before and after a command: every file under a folder, by content."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree_digest(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file below ``root`` (a changed, added or removed file shows)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
