"""A checkpoint save that runs out of disk space (or quota): recognising it, and the one line that reports it.

megatron-core's writer threads report a failed write by the exception's type only (the errno is lost on the
way), so besides an ``OSError`` found in the exception's chain, a failed save asks the disk itself
(:func:`probe_no_space`) before its partial files are removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import torch.distributed as dist

from bio_megatron.utils.errors import CheckpointError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT ``OSError`` behind ``exc`` (its cause chain, or one of the per-rank failures torch's
    ``CheckpointException`` collects), or None."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return None


def probe_no_space(folder: Path, size: int = 1 << 20) -> OSError | None:
    """Write (and remove) ``size`` bytes in ``folder``: the ENOSPC/EDQUOT error when the disk or quota is full.
    megatron-core's writer threads report a failed write by the exception's type only (the errno is lost), so a
    failed save is asked about the disk afterwards, before its partial files are removed."""
    probe = Path(folder) / f".space_probe.{os.getpid()}"
    try:
        with probe.open("wb") as fh:
            fh.write(b"\0" * size)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return exc if exc.errno in NO_SPACE else None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def disk_full_after(exc: BaseException, root: Path, is_writer: bool) -> bool:
    """Did a save fail for want of space? Rank 0 probes the disk before anything is removed; a failed
    dist-checkpointing write is raised on every rank (megatron-core broadcasts it), so there its verdict is shared."""
    verdict = [is_writer and root.is_dir() and probe_no_space(root) is not None]
    if hasattr(exc, "failures") and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    return bool(verdict[0])


def no_space_error(root: Path, step: int) -> CheckpointError:
    latest = root / "latest"
    kept = f"{latest} still names iteration {latest.read_text().strip()}" if latest.is_file() else "no checkpoint was kept"
    return CheckpointError(f"no space left on {root} while saving checkpoint iteration {step} (the incomplete save "
                           f"was removed; {kept}); free space or move exp_manager.exp_dir, then run the same command "
                           "to resume")
