"""Our replacements around dist-checkpointing's file I/O: the write-results queue of a save, the ``pickle`` of a load.

Both are installed from the seam (:mod:`bio_megatron.parallel.seam`): ``install("save")`` before every
dist-checkpointing save, ``with install("load", unpickler=...)`` around every load.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
from typing import Any, Iterator


def in_process_write_queue() -> None:
    """dist-checkpointing collects each save's write results through a *spawn* ``multiprocessing.Manager``
    queue, started on the first save (3-4 s on CPU, it re-imports ``__main__``, and the Manager process
    outlives a rank that is SIGKILLed). Our saves are synchronous: the writer threads and the reader of the
    results are in this process (``execute_sync`` in megatron-core's async_utils), so a plain thread-safe
    queue does the same job and no process is started at all."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa

    if not isinstance(getattr(fa, "_results_queue", None), queue.Queue):
        fa._results_queue = queue.Queue()


def forget_write_queue() -> None:
    """Drop the write-results queue (megatron's initial state; the next save installs a fresh one)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa

    if isinstance(getattr(fa, "_results_queue", None), queue.Queue):
        fa._results_queue = None


class MetadataPickle:
    """Stands in for the ``pickle`` module inside torch's filesystem reader: ``load`` and ``Unpickler`` are the
    restricted unpickler given, everything else is the real module's."""

    def __init__(self, unpickler: type[pickle.Unpickler]) -> None:
        self.Unpickler = unpickler

    def load(self, fh: Any, *args: Any, **kwargs: Any) -> Any:
        return self.Unpickler(fh).load()

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


@contextlib.contextmanager
def metadata_pickle(unpickler: type[pickle.Unpickler]) -> Iterator[MetadataPickle]:
    """While the block runs, torch's dist-checkpoint reader unpickles ``.metadata`` with ``unpickler`` (an
    allow-list: torch's reader uses plain ``pickle.load``)."""
    from torch.distributed.checkpoint import filesystem

    saved = filesystem.pickle
    stand_in = MetadataPickle(unpickler)
    filesystem.pickle = stand_in
    try:
        yield stand_in
    finally:
        filesystem.pickle = saved
