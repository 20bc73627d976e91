"""The NeMo document being rewritten into our keys: what :mod:`~bio_megatron.config.nemo_compat` and
:mod:`~bio_megatron.config.nemo_lightning` (the Lightning 1.x trainer keys) both write into, kept apart so that
neither imports the other's internals."""

from __future__ import annotations

from typing import Any


class NemoDoc:
    """The flat document being rewritten, with the command-line keys that win a rename conflict."""

    def __init__(self, flat: dict[str, Any], cli_keys: set[str]):
        self.flat, self.cli_keys = flat, cli_keys
        self.out: dict[str, Any] = {}
        self.source: dict[str, str] = {}  # our key -> the key it came from
        self.problems: list[str] = []
        self.ignored: dict[str, str] = {}

    def pop(self, key: str, default: Any = None) -> Any:
        return self.flat.pop(key, default)

    def from_cli(self, key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in self.cli_keys)

    def set(self, target: str, value: Any, src: str) -> None:
        """Write our key; two different values for one key are an error unless one came from the command line."""
        if target in self.out and self.out[target] != value:
            prev = self.source[target]
            if self.from_cli(src) and not self.from_cli(prev):
                pass
            elif self.from_cli(prev) and not self.from_cli(src):
                return
            else:
                self.problems.append(f"{prev} ({self.out[target]!r}) and {src} ({value!r}) set the same thing "
                                     f"({target}); keep one")
                return
        self.out[target], self.source[target] = value, src
