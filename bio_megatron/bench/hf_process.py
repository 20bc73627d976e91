"""The Hugging Face side of ``bench pretrain`` on CPU, in a process of its own, stepped from the parent.

Both sides used to run in one process. On the CPU that couples them through glibc's heap: blocks one side frees
are what the other's next allocations get, and whether a large block comes back from the heap or from a fresh
``mmap`` (every page faulted in and zeroed by the kernel) depends on what ran just before. The same code then
measured ours/HF anywhere between 0.98 and 1.10 at 345m. Here the HF model lives in a fresh interpreter (the
``spawn`` start method: glibc's defaults, as a user's own HF script gets them), built from the same initial
weights, and the parent still alternates the two sides' timed steps (``time_steps``), so that load from other
processes weighs on both alike. A step request and its timings travel over a pipe; the step runs in the child.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import traceback
from pathlib import Path
from typing import Any

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def _worker(conn, args: dict[str, Any], dtype_name: str, weights_path: str, threads: int) -> None:
    """Build the HF side from the saved weights, report ready, then run one train step per request."""
    try:
        import torch

        from bio_megatron.bench.hf_pretrain import hf_step

        torch.set_num_threads(threads)
        weights = torch.load(weights_path, weights_only=True)
        step, optimizer = hf_step(argparse.Namespace(**args), getattr(torch, dtype_name), weights)
        del weights
        conn.send(("ready", optimizer))
        while conn.recv() == "step":
            conn.send(("ok", step()))
    except BaseException:  # the parent raises it with the child's traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _options(args: argparse.Namespace) -> dict:
    """The benchmark's options for the child: values only. The CLI's ``func`` (a closure, since ``cli/bench.py``
    wraps each command in its ``[hf]`` extra check) cannot be pickled, and the child never calls it."""
    return {k: v for k, v in vars(args).items() if not callable(v)}


class HFProcess:
    """``step()`` runs one timed HF train step in the child and returns its parts; ``close()`` ends the child."""

    def __init__(self, args: argparse.Namespace, dtype: "Any", weights: dict) -> None:
        import torch

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
            path = Path(tmp) / "weights.pt"
            torch.save(weights, path)
            self._proc = ctx.Process(target=_worker, daemon=True, name="bench-hf", args=(
                child, _options(args), str(dtype).removeprefix("torch."), str(path), torch.get_num_threads()))
            self._proc.start()
            child.close()
            self.optimizer = self._receive()  # the weights are loaded once the child is ready
        log.info("HF baseline runs in its own process (pid %d)", self._proc.pid)

    def _receive(self) -> Any:
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self._proc.join(timeout=10)
            raise RuntimeError(f"the HF baseline process exited (code {self._proc.exitcode}) without a result; "
                               "out of memory?") from None
        if status == "error":
            raise RuntimeError(f"the HF baseline process failed:\n{payload}")
        return payload

    def step(self) -> dict[str, float]:
        self._conn.send("step")
        return self._receive()

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send("stop")
            except OSError:
                pass
            self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()
