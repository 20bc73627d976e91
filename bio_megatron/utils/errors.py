"""User-facing errors: the CLI prints the message (no traceback) and exits non-zero."""

from __future__ import annotations


class BioMegatronError(Exception):
    """An error caused by the user's input (file, key, value); the message names the thing and what was expected."""

    exit_code = 2


class ConfigError(BioMegatronError):
    """One or more configuration problems, collected and raised at once."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        head = f"invalid configuration{f' ({source})' if source else ''}:"
        super().__init__("\n".join([head] + [f"  - {p}" for p in self.problems]))


class DataError(BioMegatronError):
    """Bad input data; the message names the file and, where known, the line or record."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path, self.line = path, line


class CheckpointError(BioMegatronError):
    """A checkpoint that cannot be read or does not match what was asked."""


class OutputError(BioMegatronError):
    """An output path that cannot be written without destroying something we did not write (or cannot be
    written at all): the message names the path and what is expected."""


class LockError(BioMegatronError):
    """An output (data prefix, run or experiment directory) is held by another live process."""


class NonFiniteError(BioMegatronError):
    """Training stopped because the loss or gradients stayed NaN/Inf for ``trainer.max_nonfinite_steps`` steps
    in a row. Exit code 3, so that a job script can tell a diverged run from a bad input (2)."""

    exit_code = 3
