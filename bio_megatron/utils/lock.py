"""An exclusive, crash-safe lock on an output (data prefix, run directory, experiment directory).

Two processes writing one output interleave silently: the second ``data tokenize`` into a prefix
deletes the first one's shards while the first keeps writing, and one of them then reports success
on a dataset that matches neither input. The lock turns that into an immediate one-line error for
the second process, naming the holder.

Why ``fcntl.flock`` on an open file rather than "create the file, delete it when done": the lock
belongs to the open file, so the kernel drops it when the holder exits for any reason (SIGKILL, OOM,
node reboot of a local disk). A lock file left behind by a crashed run never blocks the next one;
only a *live* holder does. The file's contents (PID, host, start time, command) are only there to
make the error message useful.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Iterator

from bio_megatron.utils.errors import DataError, LockError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def _holder_info() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": _dt.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv else ""}


def _read_holder(fd: int) -> dict[str, object]:
    """What the holder wrote; empty when it has not written yet (or wrote something else)."""
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _in_use_message(lock_path: Path, what: str, holder: dict[str, object]) -> str:
    if holder.get("pid"):
        who = f"PID {holder['pid']} on host {holder.get('host', '?')}"
        if holder.get("since"):
            who += f" (since {holder['since']})"
    else:
        who = "another process (it has not recorded its PID yet)"
    return f"{lock_path}: {what} is in use by {who}; wait for it or choose another output"


def _open_locked(lock_path: Path, what: str) -> int:
    """Open ``lock_path`` and take the exclusive lock without waiting; return the descriptor."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        # e.g. the prefix's folder is a regular file, or the folder is read-only: one line, not a traceback.
        blocker = next((p for p in lock_path.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else (e.strerror or str(e))
        raise DataError(f"cannot create the lock file for {what} ({why}); "
                        "choose a writable output location", str(lock_path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LockError(_in_use_message(lock_path, what, holder)) from None
        raise DataError(f"cannot lock {what} ({e.strerror or e})", str(lock_path)) from None
    return fd


@contextlib.contextmanager
def exclusive_lock(lock_path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` for the ``with`` block, or raise ``LockError`` at once.

    ``what`` names the guarded thing in the message ("output prefix data/pubmed", "run directory
    runs/x"). The lock file's parent folders are created. The file is removed on a clean release;
    after a crash it stays, harmlessly, with the dead holder's PID in it.
    """
    lock_path = Path(lock_path)
    while True:
        fd = _open_locked(lock_path, what)
        # The previous holder may have unlinked the file between our open and our flock: then we
        # locked an orphaned inode that a third process could not see. Retry on the current file.
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_info()) + "\n").encode("utf-8"), 0)
        yield
    finally:
        # Unlink before closing (i.e. while still holding the lock), so nobody can lock the old
        # inode and believe they own the path; the inode check above covers a waiter that opened it.
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)
