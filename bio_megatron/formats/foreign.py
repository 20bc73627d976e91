"""Other programs' models used directly as a source: ``model.restore_from_path=FILE.nemo``,
``predict ner --checkpoint DIR_OF_MEGATRON_LM``, an HF folder that has only ``tokenizer.json``.

A ``.nemo`` archive or a Megatron-LM checkpoint is imported once into a checkpoint of ours (the very
``bio-megatron import nemo|megatron-lm`` command, so a source behaves exactly like its import) and
everything downstream reads that. Why a child process and a cache:

- the import builds a TP1 model in a one-process world, while ``finetune`` resolves its source on every rank
  of a TP/PP world before that world exists; a child process with the distributed variables removed cannot
  join (or pre-empt) the parent's world;
- every rank of a run (and every later ``predict``) needs the same conversion: the first one to take the
  lock writes it, the others wait and reuse it. The cache key is the source's path, sizes and modification
  times, so an edited source is converted again.

The cache lives under ``$TMPDIR/bio_megatron_sources/`` (per node); delete it freely.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
# what resolve_world reads: the child must be a world of its own
_WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def cache_dir() -> Path:
    root = Path(tempfile.gettempdir()) / "bio_megatron_sources"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _fingerprint(path: Path) -> str:
    """Path, sizes and modification times of every file of the source."""
    h = hashlib.sha256(str(path.resolve()).encode())
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if f != path else f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def imported(path: Path, kind: str) -> Path:
    """Our checkpoint converted from the ``kind`` source at ``path`` (converted now, or reused)."""
    root = cache_dir()
    out = root / f"{kind}-{_fingerprint(path)}"
    with open(root / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocking: the other ranks wait for the first one's conversion
        if (out / "bio_megatron.json").is_file():
            log.info("%s: using its conversion %s", path, out)
            return out
        flag = "--model" if kind == "nemo" else "--checkpoint"
        cmd = [sys.executable, "-m", "bio_megatron", "import", kind, flag, str(path), "--out", str(out), "--overwrite"]
        env = {k: v for k, v in os.environ.items() if k not in _WORLD_VARS}
        log.info("%s: importing it (bio-megatron import %s) into %s", path, kind, out)
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
            detail = lines[-1] if lines else f"exit {run.returncode}"
            # the import's own one-line error, minus its logger prefix
            detail = detail.split("] ", 1)[-1] if detail.startswith("[") else detail
            hint = " (import it with --vocab first)" if kind == "megatron-lm" and "vocab" in detail.lower() else ""
            raise CheckpointError(f"{path}: cannot be used as a {kind} source: {detail}{hint}")
    return out


def cached_vocab(tokens: list[str]) -> Path:
    """A ``vocab.txt`` for ``tokens`` (read from a ``tokenizer.json``), named by its content so that every
    process and every later run shares the same file; written atomically."""
    text = "\n".join(tokens) + "\n"
    file = cache_dir() / f"vocab-{hashlib.sha256(text.encode()).hexdigest()[:24]}.txt"
    if not file.is_file():
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False, encoding="utf-8") as fh:
            fh.write(text)
        os.replace(fh.name, file)
    return file
