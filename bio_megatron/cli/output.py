"""What the scoring commands (``evaluate``, ``analyse``) print: one place, so the subcommand modules need not
import each other for it."""

from __future__ import annotations

import json
import sys


def emit(obj: dict | str) -> int:
    """Print the result (a dict as indented JSON). A reader that stops early (``| head``) is handled once, in
    ``cli.main``, which flushes stdout inside its error handling."""
    sys.stdout.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2) + "\n")
    return 0
