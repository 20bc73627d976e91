"""Optional extras (pyproject.toml ``[project.optional-dependencies]``): the one place that says which ``pip install``
brings what a command needs.

transformers is the ``[hf]`` extra: pretraining, fine-tuning, prediction, evaluation, the data and vocabulary
commands, distillation and the imports of Hugging Face, Megatron-LM and NeMo checkpoints (all read with our own
readers: safetensors, tokenizers, torch) run without it. What needs it: ``export hf`` (transformers' config and
tokenizer classes write the folder), every ``import ... --verify`` (its reference is transformers' own model) and
the ``bench`` comparisons against transformers. Those commands call :func:`require_transformers` first, so that a
missing or unusable transformers is one line and exit 2 before anything is written, not a traceback halfway.
"""

from __future__ import annotations

import re

from bio_megatron.utils.errors import BioMegatronError

# pyproject.toml's [hf] extra says the same range (tests/test_optional_hf.py holds them equal): outside it, the
# exported folders and the --verify references are not what our converters were written against.
TRANSFORMERS_SPEC = ">=5.23,<6"
HF_INSTALL = "pip install 'bio-megatron[hf]'"


class MissingExtraError(BioMegatronError):
    """A command needs an optional dependency that is not installed (or not a version it works with)."""


def _numbers(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "5.24.0.dev0" -> (5, 24, 0); "" -> ()."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(x) for x in match.group(0).split(".")) if match else ()


def _pad(numbers: tuple[int, ...], n: int) -> tuple[int, ...]:
    return numbers + (0,) * (n - len(numbers))


def in_spec(version: str, spec: str = TRANSFORMERS_SPEC) -> bool:
    """Whether ``version`` satisfies ``spec``, a comma-separated list of ``>=`` / ``<`` bounds (all this module
    states; no dependency on ``packaging``, which a minimal environment may lack)."""
    have = _numbers(version)
    if not have:
        return False
    for part in spec.split(","):
        op, bound = re.fullmatch(r"\s*(>=|<)\s*([\d.]+)\s*", part).groups()
        limit = _numbers(bound)
        width = max(len(have), len(limit))
        a, b = _pad(have, width), _pad(limit, width)
        if (op == ">=" and a < b) or (op == "<" and a >= b):
            return False
    return True


def require_transformers(command: str) -> None:
    """Raise :class:`MissingExtraError` (exit 2, one line naming ``command`` and the install) unless a transformers
    in :data:`TRANSFORMERS_SPEC` imports. Call it before the command writes anything."""
    try:
        import transformers
    except ImportError as exc:  # absent, or present but broken (e.g. built for another torch)
        missing = getattr(exc, "name", None) == "transformers"
        first = (str(exc).splitlines() or [""])[0]  # one line, whatever the import raised
        why = "is not installed" if missing else f"does not import ({type(exc).__name__}: {first})"
        raise MissingExtraError(f"bio-megatron {command} needs transformers, which {why}: {HF_INSTALL}") from None
    version = getattr(transformers, "__version__", "")
    if not in_spec(version):
        raise MissingExtraError(f"bio-megatron {command} needs transformers{TRANSFORMERS_SPEC} (installed: "
                                f"{version or 'unknown version'}): {HF_INSTALL}")
