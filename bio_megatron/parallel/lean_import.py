"""Import megatron-core without two start-up costs that no command here uses at import time.

``import megatron.core`` took 4 s of a fine-tuning run's ~13 s start-up on two cores (measured 2026-11-26; torch
itself 1.2-1.5 s more). Two parts of it do nothing for our commands at that point:

* **torch.compile at decoration time.** ``megatron.core.jit`` sets ``jit_fuser = torch.compile`` and about 40
  fused helpers are decorated with it as their modules load; calling ``torch.compile(fn)`` imports TorchDynamo and
  Inductor's ``compile_fx`` (~2.6 s together, ~1.1 s of it Inductor alone), although compiling only ever happens on
  a helper's first call. While ``megatron.core`` loads, ``torch.compile`` is swapped for :func:`deferred_compile`,
  which hands back a function that makes that same ``torch.compile`` call on its first use: a helper that runs
  compiles exactly as before, only the imports move to its first call, and the paths that never call one (ours:
  ``models/bert.py`` keeps megatron's fusions off) never pay for them.
* **wandb at import time.** ``megatron.core.timers`` imports wandb (0.4-3 s, when installed) for ``Timers.write``,
  which nothing here calls (our W&B logging is :mod:`bio_megatron.training.trackers`, which imports wandb itself
  when a run asks for it). ``wandb`` is hidden while ``megatron.core`` loads, so megatron's ``try: import wandb``
  takes its not-installed branch; it is importable again as soon as that is done.

Both are undone when the import returns; modules of megatron-core imported later (lazily) see the real
``torch.compile``. Nothing changes once megatron-core is already imported (a forked test world, a second call).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from typing import Any, Callable, Iterator

import torch

_real_compile: Callable[..., Any] = torch.compile


def deferred_compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile``'s signature; a plain function comes back wrapped so that the real ``torch.compile(model,
    **kwargs)`` runs on its first call (a module, or anything else, is compiled at once, as before)."""
    if model is None:  # @torch.compile(mode=...) used as a decorator factory
        return functools.partial(deferred_compile, **kwargs)
    if not isinstance(model, types.FunctionType):
        return _real_compile(model, **kwargs)
    compiled: Callable[..., Any] | None = None

    @functools.wraps(model)
    def compile_on_first_call(*args: Any, **kw: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            compiled = _real_compile(model, **kwargs)
        return compiled(*args, **kw)

    return compile_on_first_call


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """While the block runs: ``torch.compile`` is :func:`deferred_compile` and ``import wandb`` raises ImportError
    (unless wandb is already imported). Both are undone when it ends. Installed only through the seam
    (``seam.import_megatron_core``), which lists it as the row for ``torch.compile``."""
    hide_wandb = "wandb" not in sys.modules
    if hide_wandb:
        sys.modules["wandb"] = None  # type: ignore[assignment]  # `import wandb` raises ImportError meanwhile
    torch.compile = deferred_compile  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = _real_compile  # type: ignore[assignment]
        if hide_wandb and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]
