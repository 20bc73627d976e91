"""Input files named for what they are, and OS errors on our outputs turned into one line.

``Path.is_file()`` answers False for a FIFO, a symlink loop and an unreadable folder alike, so a user who
passed a named pipe was told "not found"; and ``open()`` on a FIFO blocks until a writer appears (a hang).
:func:`check_input_file` looks with ``os.stat`` (never opening a non-regular file) and says which it is.
:func:`os_error` gives the one-line :class:`DataError` for a disk that filled or a file that cannot be read
or written, naming the path ("no space left on <path>").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

from bio_megatron.utils.errors import DataError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe), not a regular file: reading it could wait forever for a "
                          "writer; write the data to a file and pass that"),
          (stat.S_ISSOCK, "a socket, not a regular file"),
          (stat.S_ISCHR, "a character device, not a regular file"),
          (stat.S_ISBLK, "a block device, not a regular file"))


def check_input_file(path: str | os.PathLike, what: str = "input file", missing: str | None = None,
                     empty: str | None = "empty file (0 bytes)") -> Path:
    """``path`` if it is a readable regular file (non-empty unless ``empty`` is None), else a :class:`DataError`
    naming the path and what it is: missing, a broken symlink, a symlink loop, a folder, a FIFO, a socket, a
    device, unreadable (permission denied)."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows links; never opens the file, so a FIFO cannot block here
    except OSError as exc:
        raise _stat_error(p, exc, what, missing) from None
    if stat.S_ISDIR(st.st_mode):
        raise DataError(f"{what} is a folder; a file is expected", str(p))
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise DataError(f"{what} is {kind}", str(p))
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{what} is not a regular file", str(p))
    try:
        os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        raise os_error(exc, p, reading=True) from None
    if empty is not None and st.st_size == 0:
        raise DataError(empty, str(p))
    return p


def _stat_error(p: Path, exc: OSError, what: str, missing: str | None) -> DataError:
    if exc.errno == errno.ELOOP:
        return DataError(f"{what} is a symbolic link loop (a link that points back to itself through "
                         f"{os.readlink(p) if os.path.islink(p) else 'its folders'}); give the real file", str(p))
    if exc.errno == errno.ENOENT and os.path.islink(p):
        return DataError(f"{what} is a broken symbolic link (to {os.readlink(p)}, which does not exist)", str(p))
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return DataError(missing or f"{what} not found", str(p))
    return os_error(exc, p, reading=True)


def os_error(exc: OSError, path: str | os.PathLike | None = None, reading: bool = False) -> DataError:
    """One line for an OS error on ``path`` (default: the error's own file name): disk full, quota, read-only,
    permission denied, anything else with its ``strerror``."""
    where = str(exc.filename if path is None and exc.filename is not None else path or "?")
    if exc.errno == errno.ENOSPC:
        return DataError(f"no space left on {where} (the device is full; partial files were removed): free "
                         "space or choose another output folder")
    if exc.errno == errno.EDQUOT:
        return DataError(f"disk quota exceeded on {where} (partial files were removed)")
    if exc.errno == errno.EROFS:
        return DataError("read-only file system: cannot write here", where)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return DataError("permission denied: cannot " + ("read this file" if reading else "write here"), where)
    if exc.errno == errno.ELOOP:
        return DataError("a symbolic link loop", where)
    return DataError(f"cannot {'read' if reading else 'write'} ({exc.strerror or exc})", where)


@contextlib.contextmanager
def disk_errors(output: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk, an exceeded quota or a read-only file system while writing ``output`` into the
    one-line :func:`os_error` (the block's own cleanup -- temporary files and folders -- has run by then)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        raise os_error(exc, exc.filename if exc.filename is not None else output) from None
