"""Fork a fresh gloo world per scenario from a parent that imported torch + megatron-core once.

Each child gets RANK/WORLD_SIZE/MASTER_* like torchrun would give it, runs ``fn(*args)`` and reports
its return value (or traceback). Children run in their own process group so that a test can SIGKILL a
whole "job" (ranks and the helper processes they started) at once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

_CTX = mp.get_context("fork")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank: int, world: int, port: int, fn: Callable, args: tuple, queue) -> None:
    os.setpgrp()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    code = 0
    try:
        queue.put((rank, "ok", fn(*args)))
    except BaseException:  # report everything to the parent, including SystemExit
        queue.put((rank, "error", traceback.format_exc()))
        code = 1
    finally:
        try:
            from bio_megatron.parallel.distributed import teardown

            teardown()
        except Exception:
            pass
        # os._exit skips multiprocessing's exit hooks: run them so helper processes a rank started stop too.
        mp.util._exit_function()
    os._exit(code)


@dataclass
class World:
    procs: list
    queue: Any

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

    def join(self, timeout: float = 300.0) -> list:
        deadline = time.time() + timeout
        results: dict[int, tuple] = {}
        while len(results) < len(self.procs) and time.time() < deadline:
            try:
                rank, status, value = self.queue.get(timeout=0.2)
                results[rank] = (status, value)
            except Exception:
                if all(not p.is_alive() for p in self.procs) and self.queue.empty():
                    break
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.time()))
        if any(p.is_alive() for p in self.procs):
            self.kill()
            raise TimeoutError(f"gloo world did not finish in {timeout} s")
        errors = [f"rank {r}:\n{v}" for r, (s, v) in sorted(results.items()) if s == "error"]
        # A rank that died without reporting (a segfault, os._exit, the OOM killer) must fail the test too.
        errors += [f"rank {r}: exited with code {p.exitcode} without reporting a result"
                   for r, p in enumerate(self.procs) if r not in results]
        if errors:
            raise RuntimeError("\n".join(errors))
        return [results[r][1] for r in range(len(self.procs))]


def start_world(world_size: int, fn: Callable, *args) -> World:
    queue = _CTX.Queue()
    port = free_port()
    procs = [_CTX.Process(target=_child, args=(r, world_size, port, fn, args, queue), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    return World(procs, queue)


def run_world(world_size: int, fn: Callable, *args, timeout: float = 300.0) -> list:
    return start_world(world_size, fn, *args).join(timeout)


@dataclass
class Ran:
    """What :func:`cli_forked` saw: as ``subprocess.CompletedProcess`` names it."""
    returncode: int
    stdout: str
    stderr: str


def _cli_child(argv: list[str], env: dict[str, str], umask: int | None, out: str, err: str) -> None:
    os.setpgrp()
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)  # a plain ``bio-megatron`` command, not a rank of a launcher's world
    os.environ.update(env)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    # As in _child: a forked child that enters the parent's OpenMP thread pool deadlocks (CI's pytest runs with
    # torch's default two threads); with one thread it never enters it.
    torch.set_num_threads(1)
    if umask is not None:
        os.umask(umask)
    code = 1
    with open(out, "w", encoding="utf-8") as fo, open(err, "w", encoding="utf-8") as fe:
        os.dup2(fo.fileno(), 1)
        os.dup2(fe.fileno(), 2)
        import sys

        sys.stdout, sys.stderr = fo, fe
        try:
            from bio_megatron.cli import main
            from bio_megatron.utils.log import setup_logging

            setup_logging(force=True)  # the project logger writes to this process's stderr, not the parent's
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            mp.util._exit_function()
    os._exit(code)


def cli_forked(argv: list[str], env: dict[str, str] | None = None, umask: int | None = None,
               timeout: float = 300.0) -> Ran:
    """``bio-megatron argv`` as a command of its own (its own process, exit code, stdout and stderr), forked from
    this process, which has imported torch, megatron-core and transformers already: the same CLI a user runs, without
    paying those imports again for every command a test runs (seconds each on the CI's two cores)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cli_forked_") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = _CTX.Process(target=_cli_child, args=(list(argv), dict(env or {}), umask, out, err))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.join()
            raise TimeoutError(f"bio-megatron {' '.join(argv)} did not finish in {timeout} s")
        with open(out, encoding="utf-8") as fo, open(err, encoding="utf-8") as fe:
            return Ran(proc.exitcode, fo.read(), fe.read())
