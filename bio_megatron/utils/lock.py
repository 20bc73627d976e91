"""An exclusive, crash-safe lock on an output (data prefix, run directory, experiment directory).

Two processes writing one output interleave silently: the second ``data tokenize`` into a prefix
deletes the first one's shards while the first keeps writing, and one of them then reports success
on a dataset that matches neither input. The lock turns that into an immediate one-line error for
the second process, naming the holder.

Why ``fcntl.flock`` on an open file rather than "create the file, delete it when done": the lock
belongs to the open file, so the kernel drops it when the holder exits for any reason (SIGKILL, OOM,
node reboot of a local disk). A lock file left behind by a crashed run never blocks the next one;
only a *live* holder does. The file's contents (PID, host, start time, command) make the error
message useful, and they are also how a lock file of ours is told from anything else at that path.

Never touching what we did not write: the path is opened with ``O_NOFOLLOW`` (a symlink there is
refused, so a link to a victim file is neither truncated nor deleted), a new lock file is born with
its contents (written to a private file, then hard-linked into place), and an existing file is used
only when it holds our JSON record (a stale lock of a crashed run does; a user's file does not).
Release unlinks the path only while it is still the inode we locked.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from bio_megatron.utils.errors import DataError, LockError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

# Keys every lock record of ours has: what identifies a file at the lock path as a lock of ours.
_RECORD_KEYS = ("pid", "host", "since")
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


def _holder_info() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": _dt.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv else ""}


def _record_bytes(size_at_least: int = 0) -> bytes:
    """Our record, padded with spaces to ``size_at_least``: rewriting a lock file in place never truncates it,
    so a crash halfway leaves our new record followed by blanks, still one readable JSON object."""
    data = (json.dumps(_holder_info()) + "\n").encode("utf-8")
    return data + b" " * max(0, size_at_least - len(data))


def _read_holder(fd: int) -> dict[str, object] | None:
    """The holder's record; None when the file is not a lock record of ours (empty, other text, other JSON)."""
    try:
        raw = os.pread(fd, 65536, 0)
        info = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and all(k in info for k in _RECORD_KEYS) else None


def _in_use_message(lock_path: Path, what: str, holder: dict[str, object] | None) -> str:
    if holder and holder.get("pid"):
        who = f"PID {holder['pid']} on host {holder.get('host', '?')}"
        if holder.get("since"):
            who += f" (since {holder['since']})"
    else:
        who = "another process (it has not recorded its PID yet)"
    return f"{lock_path}: {what} is in use by {who}; wait for it or choose another output"


def _not_ours(lock_path: Path, what: str, why: str) -> DataError:
    return DataError(f"{why}, not a lock file of bio-megatron; refusing to use or remove it (the lock for {what} "
                     "goes here): move it away or choose another output", str(lock_path))


def _create_locked(lock_path: Path, what: str) -> int | None:
    """A new lock file at ``lock_path``, already locked and holding our record; None when the path exists.

    The record is written and locked in a private file first and then hard-linked into place, so nobody ever
    sees an empty lock file of ours (an empty file at the path is somebody else's)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{lock_path.name}.", suffix=".tmp", dir=lock_path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else can see this file yet
        os.pwrite(fd, _record_bytes(), 0)
        os.fchmod(fd, 0o644)
        try:
            os.link(tmp, lock_path, follow_symlinks=False)
        except FileExistsError:
            os.close(fd)
            return None
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            os.close(fd)  # a file system without hard links: create in place (empty for a moment)
            return _create_in_place(lock_path)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_in_place(lock_path: Path) -> int | None:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours alone: it did not exist a moment ago
    os.pwrite(fd, _record_bytes(), 0)
    return fd


def _open_existing(lock_path: Path, what: str) -> int | None:
    """Open the file already at ``lock_path`` without following a symlink; None when it vanished meanwhile."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_ours(lock_path, what, f"is a symbolic link (to {os.readlink(lock_path)})") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_ours(lock_path, what, "is not a regular file")
    return fd


def _open_locked(lock_path: Path, what: str) -> tuple[int, bool]:
    """Take the exclusive lock at ``lock_path`` without waiting: ``(descriptor, created)``."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = _create_locked(lock_path, what)
            if fd is not None:
                return fd, True
            fd = _open_existing(lock_path, what)
            if fd is not None:
                break
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
    # Locked: no live holder. Ours only if it holds our record (a crashed run's stale lock does).
    if _read_holder(fd) is None:
        os.close(fd)
        raise _not_ours(lock_path, what, "holds something else")
    return fd, False


def _same_file(fd: int, lock_path: Path) -> bool:
    try:
        here, held = os.stat(lock_path, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def exclusive_lock(lock_path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` for the ``with`` block, or raise ``LockError`` at once.

    ``what`` names the guarded thing in the message ("output prefix data/pubmed", "run directory
    runs/x"). The lock file's parent folders are created. The file is removed on a clean release;
    after a crash it stays, harmlessly, with the dead holder's PID in it. A symlink, a non-file or a
    file that is not a lock of ours at ``lock_path`` is a :class:`DataError` (exit 2), left untouched.
    """
    lock_path = Path(lock_path)
    while True:
        fd, created = _open_locked(lock_path, what)
        # The previous holder may have unlinked the file between our open and our flock: then we
        # locked an orphaned inode that a third process could not see. Retry on the current file.
        if _same_file(fd, lock_path):
            break
        os.close(fd)
    try:
        if not created:  # a stale lock of ours: our record replaces the dead holder's, in place
            os.pwrite(fd, _record_bytes(os.fstat(fd).st_size), 0)
        yield
    finally:
        # Unlink before closing (i.e. while still holding the lock), so nobody can lock the old inode and
        # believe they own the path; and only while the path is still our file (never someone else's).
        with contextlib.suppress(OSError):
            if _same_file(fd, lock_path):
                os.unlink(lock_path)
        os.close(fd)
