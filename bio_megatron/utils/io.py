"""Atomic outputs: write to a temporary path beside the target, rename when complete.

Folder outputs (``export hf``, ``import hf``, ``export``/``import megatron-lm``) follow one rule: the target must be absent, an empty folder,
or -- with ``overwrite`` -- an earlier output of the same command, recognised by the marker file
:data:`OUTPUT_MARKER` we write into every folder we produce. Anything else is refused before any work is
done, so files we did not write are never removed. The marker also lists the files the output was written with
(its manifest): ``--overwrite`` refuses, naming them, when files were added to the folder since.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

from bio_megatron import __version__
from bio_megatron.utils.errors import DataError, OutputError

OUTPUT_MARKER = ".bio_megatron_output.json"


def _read_marker(folder: Path) -> dict:
    """``folder``'s marker (empty when it has none or it does not read)."""
    try:
        marker = json.loads((folder / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _marker_command(folder: Path) -> str | None:
    """The command that wrote ``folder`` according to its marker, or None (no marker, unreadable marker)."""
    return _read_marker(folder).get("command")


def _written_files(folder: Path) -> list[str]:
    """Every file, symlink and empty folder under ``folder`` (relative, '/'-separated), the marker left out:
    the manifest of what one of our outputs holds."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        entries = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        if not entries and not dirs and root != str(folder):
            found.append(rel.as_posix() + "/")
        found += [(rel / name).as_posix() for name in entries if (rel / name).as_posix() != OUTPUT_MARKER]
    return sorted(found)


def _added_since(target: Path, command: str) -> str | None:
    """Why ``target`` (an earlier ``command`` output) cannot be replaced wholesale, or None when it can.

    ``--overwrite`` removes only what we wrote: the marker lists it (``files``). Anything else found there was
    added by someone else since, so we refuse and name it rather than carry it into the new output (a stale
    ``config.json`` or weights file carried over could silently change what the folder loads as). A marker
    from before manifests were kept cannot tell the two apart: refused too, saying so."""
    written = _read_marker(target).get("files")
    if not isinstance(written, list):
        return (f"{target}: an earlier `{command}` output written before bio-megatron listed the files it writes "
                f"({OUTPUT_MARKER} has no \"files\"), so files added since cannot be told apart; refusing to "
                "replace it: remove it yourself or choose a new folder")
    added = sorted(set(_written_files(target)) - set(written))
    if not added:
        return None
    shown = ", ".join(added[:5]) + (f" and {len(added) - 5} more" if len(added) > 5 else "")
    return (f"{target}: holds {len(added)} file(s) that the earlier `{command}` output did not write ({shown}); "
            "--overwrite replaces only what we wrote: move them away or choose a new folder")


def check_output_dir(target: str | os.PathLike, command: str, overwrite: bool = False) -> None:
    """Refuse (:class:`OutputError`) a folder target that is not absent, empty, or -- with ``overwrite`` --
    an earlier output of ``command``. Called before the work, and again just before the swap."""
    target = Path(target)
    if not target.exists() and not target.is_symlink():
        return
    hint = f"choose a new or empty folder (--overwrite replaces only an earlier `{command}` output)"
    if target.is_symlink() or not target.is_dir():
        raise OutputError(f"{target}: exists and is not a folder; {hint}")
    try:
        empty = next(os.scandir(target), None) is None
    except OSError as exc:
        raise OutputError(f"{target}: cannot be read ({exc.strerror}); {hint}") from None
    if empty:
        return
    wrote = _marker_command(target)
    if wrote == command:
        if not overwrite:
            raise OutputError(f"{target}: holds an earlier `{command}` output; pass --overwrite to replace it")
        problem = _added_since(target, command)
        if problem:
            raise OutputError(problem)
        return
    what = f"a `{wrote}` output" if wrote else f"files not written by `{command}` (no {OUTPUT_MARKER})"
    raise OutputError(f"{target}: not empty, holds {what}; refusing to replace it: {hint}")


def check_output_file(target: str | os.PathLike) -> None:
    """Refuse (:class:`OutputError`) a file target that is a folder or whose folder cannot be written;
    cheap enough to call before hours of work."""
    target = Path(target)
    try:
        if target.is_dir():
            raise OutputError(f"{target}: is a folder; a file path is expected")
        parent = target.parent
        while not parent.exists() and parent != parent.parent:  # the nearest existing ancestor gets the folders
            parent = parent.parent
        if not parent.is_dir():
            raise OutputError(f"{target}: {parent} is not a folder")
    except PermissionError as exc:  # pathlib ignores ENOENT/ENOTDIR but raises EACCES: a folder on the way is closed
        raise OutputError(f"{target}: cannot be reached ({exc.strerror}: {exc.filename})") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{target}: folder {parent} is not writable")


# Where no output of ours belongs: the root and the operating system's own folders. We are often run as root
# in containers, where nothing else stops ``--out /etc/passwd`` from replacing a system file.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
               "/usr", "/var/lib", "/var/log")
_MAX_SCANNED = 200_000  # files of an input folder compared with an existing output (a PubMed baseline: ~1,300)


def system_folder(path: Path) -> str | None:
    """The system folder ``path`` is (or is in), or None; ``path`` is absolute."""
    text = str(path)
    if text == "/":
        return "/"
    return next((d for d in SYSTEM_DIRS if text == d or text.startswith(d + "/")), None)


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks: a link to an input is that input
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _same_file_in(folder: Path, ident: tuple[int, int]) -> Path | None:
    """A file under ``folder`` that is the file ``ident`` (a hard link or a symlink to it), or None."""
    scanned = 0
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            scanned += 1
            if _identity(os.path.join(root, name)) == ident:
                return Path(root) / name
        if scanned > _MAX_SCANNED:
            break
    return None


def check_output_path(target: str | os.PathLike, inputs: list[str | os.PathLike] = (), what: str = "output") -> None:
    """Refuse (:class:`OutputError`) an output that is one of the command's inputs or a system path.

    One check for every command's outputs, files and folders alike, made before any work: the target must not
    be ``/`` or under a system folder (the path as given and with its symlinks resolved); an existing target
    must not be one of ``inputs`` (same device and inode, so hard links and symlinks count) nor a file inside
    an input folder; and an existing folder target must not hold an input (replacing it would delete it).
    Inputs that do not exist (a built-in vocabulary's name) are skipped."""
    given = Path(os.path.abspath(target))
    real = Path(os.path.realpath(target))
    for path in (given, real):
        system = system_folder(path)
        if system is not None:
            where = "the root folder" if system == "/" else f"a system folder ({system})"
            raise OutputError(f"{target}: {what} would be written in {where}; refusing to write there, "
                              "choose a path of your own")
    ident = _identity(target)
    if ident is None:
        return  # nothing there yet: it cannot be an input
    for item in inputs:
        if item is None:
            continue
        item_ident = _identity(item)
        if item_ident is None:
            continue
        if item_ident == ident:
            raise OutputError(f"{target}: {what} is the input {item} (the same file, through a link or not); "
                              "writing it would destroy the input: choose another output")
        item_real = Path(os.path.realpath(item))
        if real.is_dir() and (item_real == real or real in item_real.parents):
            raise OutputError(f"{target}: {what} is a folder holding the input {item}; "
                              "replacing it would destroy the input: choose another output")
        if item_real.is_dir() and not real.is_dir():
            same = _same_file_in(item_real, ident)
            if same is not None:
                raise OutputError(f"{target}: {what} is {same}, a file of the input folder {item}; "
                                  "writing it would destroy the input: choose another output")


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # old kernel / a file system without exchange: fall back to rename-aside
    raise OSError(err, os.strerror(err), str(b))


def _swap_in_dir(tmp: Path, target: Path, command: str | None, overwrite: bool) -> None:
    """Move the finished folder ``tmp`` onto ``target`` (re-checked first). Each step is one atomic rename or
    exchange, so a crash leaves either the old or the new output at ``target``; only on a file system
    without ``RENAME_EXCHANGE`` is there a moment without it, with the old output complete beside it."""
    if command is None:  # no marker to recognise an earlier output by: only an absent or empty target
        if target.is_symlink() or (target.exists() and not (target.is_dir()
                                                            and next(os.scandir(target), None) is None)):
            raise OutputError(f"{target}: exists and is not an empty folder; refusing to replace it")
    else:
        check_output_dir(target, command, overwrite)  # again: the target may have changed while we worked
    if not target.exists() or next(os.scandir(target), None) is None:
        os.replace(tmp, target)  # rename(2) onto an absent path or an empty folder is atomic
        return
    # An earlier output of ours: exchange the two in one step, then delete the old one (now at tmp).
    if _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    # No exchange: move the old output aside under a visible name, move the new one in, delete the old.
    # A crash between the two renames leaves the old output complete at ``.<name>.old-*``, never deleted.
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, aside)
    os.replace(tmp, target)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "", *, command: str | None = None,
                overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` only on success.

    Works for files and directories: whatever the caller creates at the yielded path is moved into place.
    A file replaces a file. A folder replaces only an absent target or an empty folder, or -- when
    ``command`` is given and ``overwrite`` is set -- an earlier output of ``command`` (its marker
    :data:`OUTPUT_MARKER` is written into every folder produced with a ``command``); the target is checked
    before the block runs too, so a refusal costs nothing.
    """
    target = Path(target)
    if target.name in ("", ".", ".."):  # `--out .`: the sibling must go next to the folder's real name
        target = Path(os.path.abspath(target))
    if command is not None:
        check_output_dir(target, command, overwrite)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"{target}: cannot write here ({exc.strerror})") from None
    os.close(fd)
    os.unlink(tmp)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.is_dir():
            if command is not None:
                (tmp_path / OUTPUT_MARKER).write_text(json.dumps(
                    {"command": command, "version": __version__, "files": _written_files(tmp_path)}, indent=2)
                    + "\n", encoding="utf-8")
            _swap_in_dir(tmp_path, target, command, overwrite)
        else:
            if target.is_dir() and not target.is_symlink():
                raise OutputError(f"{target}: is a folder; a file path is expected")
            os.replace(tmp_path, target)
    finally:
        if tmp_path.is_dir() and not tmp_path.is_symlink():
            shutil.rmtree(tmp_path, ignore_errors=True)
        elif tmp_path.exists() or tmp_path.is_symlink():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_open(target: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """``open()`` a temporary file that replaces ``target`` only when the block finishes without error."""
    with atomic_path(target) as tmp:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_json_atomic(target: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    with atomic_open(target, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=indent, sort_keys=False)
        fh.write("\n")


def load_json(path: str | os.PathLike, missing: str = "file not found") -> Any:
    """``json.load`` with a :class:`DataError` naming the file and line on broken JSON."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing, str(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"broken JSON: {exc.msg} (column {exc.colno})", str(path), exc.lineno) from None


def iter_json_lines(path: str | os.PathLike, missing: str = "file not found") -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file; broken JSON is a
    :class:`DataError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing, str(path))
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"broken JSON: {exc.msg} (column {exc.colno})", str(path), lineno) from None
