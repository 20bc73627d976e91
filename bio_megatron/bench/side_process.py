"""A benchmark side in a process of its own, stepped from the parent over a pipe.

``bench pretrain`` (its transformers side, on the CPU) and ``bench finetune`` (both sides) keep what they time in a
fresh interpreter (``spawn``: glibc's heap defaults, as a user's own script gets them; two sides sharing one heap
couple their timings, ``bench/hf_process.py`` says how) and alternate the sides' timed steps from the parent, so
that other jobs' load weighs on both alike. The child runs :func:`serve`: it builds its side, reports ready (with
what the parent needs from it), then answers each request with the result of one step; an exception there travels
back with its traceback, and the parent raises it.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Callable

STOP = "stop"


def serve(conn, build: Callable[[], tuple[Callable[[Any], Any], Any]],
          finish: Callable[[], None] | None = None) -> None:
    """The child's side of the pipe: ``build()`` returns ``(step, ready)``; ``ready`` goes to the parent, then
    ``step(request)`` answers each request until :data:`STOP`, and ``finish()`` runs before the child ends."""
    try:
        step, ready = build()
        conn.send(("ready", ready))
        while (request := conn.recv()) != STOP:
            conn.send(("ok", step(request)))
        if finish is not None:
            finish()
    except BaseException:  # the parent raises it with the child's traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class SideProcess:
    """``target(conn, *args)`` (which calls :func:`serve`) in a ``spawn``ed process named ``name`` in messages."""

    def __init__(self, name: str, target: Callable[..., None], args: tuple) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(child, *args), daemon=True,
                                 name=f"bench-{name.replace(' ', '-')}")
        self._proc.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def send(self, obj: Any) -> None:
        self._conn.send(obj)

    def receive(self) -> Any:
        """The child's next answer (its ``ready`` payload first); RuntimeError with its traceback if it failed."""
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self._proc.join(timeout=10)
            raise RuntimeError(f"the {self.name} process exited (code {self._proc.exitcode}) without a result; "
                               "out of memory?") from None
        if status == "error":
            raise RuntimeError(f"the {self.name} process failed:\n{payload}")
        return payload

    def request(self, obj: Any) -> Any:
        self._conn.send(obj)
        return self.receive()

    def close(self, timeout: float = 60) -> None:
        """Stop the child (its ``finish`` runs), killed if it has not ended within ``timeout`` seconds."""
        if self._proc.is_alive():
            try:
                self._conn.send(STOP)
            except OSError:
                pass
            self._proc.join(timeout=timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
