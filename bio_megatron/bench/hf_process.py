"""The Hugging Face side of ``bench pretrain`` on CPU, in a process of its own, stepped from the parent.

Both sides used to run in one process. On the CPU that couples them through glibc's heap: blocks one side frees
are what the other's next allocations get, and whether a large block comes back from the heap or from a fresh
``mmap`` (every page faulted in and zeroed by the kernel) depends on what ran just before. The same code then
measured ours/HF anywhere between 0.98 and 1.10 at 345m. Here the HF model lives in a fresh interpreter (the
``spawn`` start method: glibc's defaults, as a user's own HF script gets them), built from the same initial
weights, and the parent still alternates the two sides' timed steps (``time_steps``), so that load from other
processes weighs on both alike. A step request and its timings travel over a pipe (``bench/side_process.py``, as
for ``bench finetune``'s two sides); the step runs in the child.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bio_megatron.bench.side_process import SideProcess, serve
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def _worker(conn, args: dict[str, Any], dtype_name: str, weights_path: str, threads: int) -> None:
    """Build the HF side from the saved weights, report ready (with its optimizer's name), then run one train step
    per request."""
    def build():
        import torch

        from bio_megatron.bench.hf_pretrain import hf_step

        torch.set_num_threads(threads)
        weights = torch.load(weights_path, weights_only=True)
        step, optimizer = hf_step(argparse.Namespace(**args), getattr(torch, dtype_name), weights)
        return (lambda _request: step()), optimizer

    serve(conn, build)


def _options(args: argparse.Namespace) -> dict:
    """The benchmark's options for the child: values only. The CLI's ``func`` (a closure, since ``cli/bench.py``
    wraps each command in its ``[hf]`` extra check) cannot be pickled, and the child never calls it."""
    return {k: v for k, v in vars(args).items() if not callable(v)}


class HFProcess:
    """``step()`` runs one timed HF train step in the child and returns its parts; ``close()`` ends the child."""

    def __init__(self, args: argparse.Namespace, dtype: "Any", weights: dict) -> None:
        import torch

        with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
            path = Path(tmp) / "weights.pt"
            torch.save(weights, path)
            self._side = SideProcess("HF baseline", _worker, (_options(args), str(dtype).removeprefix("torch."),
                                                              str(path), torch.get_num_threads()))
            self.optimizer = self._side.receive()  # the weights are loaded once the child is ready
        log.info("HF baseline runs in its own process (pid %d)", self._side.pid)

    def step(self) -> dict[str, float]:
        return self._side.request("step")

    def close(self) -> None:
        self._side.close(timeout=30)
