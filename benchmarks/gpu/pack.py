"""``make gpu-pack``: the wheels a bare GPU machine lacks, downloaded once, so ``check.sh`` needs no network there.

A lent GPU machine has Python 3.12 with PyTorch, transformers, tokenizers and safetensors (and what they depend on)
and nothing else; it cannot reach a package index. The pack is every other distribution that bio-megatron's
runtime dependencies (``pyproject.toml``) pull in, plus the test runner the check uses (pytest), plus our own
package as a wheel, each pinned to the version installed in the environment running this script (the one the
test suite ran against), for CPython 3.12 on x86-64 Linux. Left out, with the reason in ``pack.json``:
matplotlib and what only it needs (``bio-megatron report`` and suite plots; the check never imports them).

Everything is written into a temporary sibling folder and renamed into place only when complete and under the
size limit, so a failed or refused run leaves the previous pack (or nothing) as it was. Exit 2 with one line on
a refusal (over the limit, a dependency missing from this environment, an output folder that is not a pack).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "gpu" / "wheels"
LIMIT = 64 * 2**20  # the lent machine takes the working tree plus carried folders up to 64 MiB in all
BASE = ("torch", "transformers", "tokenizers", "safetensors")  # what a bare GPU machine has
# In the base, but carried at this environment's version all the same: the lent machine's transformers (5.17.0, read
# 2026-11, /work/.library/device/KINDS.md) is below the [hf] range (utils/extras.TRANSFORMERS_SPEC) that bench and
# --verify require, and transformers 5.23 needs regex >= 2025.10.22, a version that machine does not state. The
# rest of transformers' requirements (huggingface-hub, tokenizers, safetensors, numpy, ...) it meets.
CARRIED = {"transformers": "the machine's may be below the [hf] range (5.17.0 there, read 2026-11)",
           "regex": "transformers >= 5.23 needs regex >= 2025.10.22; the machine's version is not known"}
EXCLUDED = {"matplotlib": "bio-megatron report / benchmark report plots only; the GPU check never imports it"}
TEST_RUNNER = ("pytest", "pytest-timeout")  # the check runs the gpu-marked tests; a bare machine has no pytest
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
# pip matches a --platform tag exactly: name every manylinux level an x86-64 wheel of our dependencies uses.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{n}_x86_64" for n in range(5, 29))]
MARKER = "pack.json"
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Name or service not known", "Network is unreachable", "ConnectTimeoutError")


class Refused(Exception):
    """One line for the user; exit 2."""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate(TARGET)


def closure(names: list[str]) -> dict[str, str]:
    """name -> installed version of ``names`` and everything they require on the target (extras not followed)."""
    seen: dict[str, str] = {}
    todo = [norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise Refused(f"{name} is a runtime dependency but is not installed in {sys.prefix}: run `make venv` "
                          f"first (the pack pins the versions installed there)") from None
        seen[name] = dist.version
        todo += [norm(r.name) for r in map(Requirement, dist.requires or []) if _applies(r)]
    return seen


def runtime_requirements() -> list[str]:
    """pyproject.toml's dependencies that apply on the target, by name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return [norm(r.name) for r in reqs if _applies(r)]


def plan() -> tuple[dict[str, str], dict[str, str]]:
    """(the pack: name -> version, the base a bare machine has: name -> version here)."""
    base = closure(list(BASE))
    wanted = [n for n in runtime_requirements() if n not in EXCLUDED and n not in base]
    pack = {n: v for n, v in closure(wanted + list(TEST_RUNNER)).items() if n not in base}
    pack.update({n: base[n] for n in CARRIED})
    return pack, base


def download(pack: dict[str, str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
           *(a for p in PLATFORMS for a in ("--platform", p)), "--dest", str(dest),
           *(f"{n}=={v}" for n, v in sorted(pack.items()))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        offline = any(s in proc.stderr for s in NETWORK_ERRORS)
        raise Refused(f"pip download failed (exit {proc.returncode}){': no network' if offline else ''}: {last}")


def build_own_wheel(dest: Path) -> None:
    """Our package from the working tree (what the machine's copy of the tree holds), built in a scratch copy so
    that no build/ or egg-info lands in the tree."""
    with tempfile.TemporaryDirectory(prefix="bio-megatron-wheel.") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(REPO / "bio_megatron", src / "bio_megatron",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (REPO / name).exists():
                shutil.copy2(REPO / name, src / name)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                               "--no-index", "--wheel-dir", str(dest), str(src)], capture_output=True, text=True)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Refused(f"building the bio-megatron wheel failed (exit {proc.returncode}): {last}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_size(folder: Path, limit: int, out: Path) -> int:
    wheels = list(folder.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    if total > limit:
        raise Refused(f"the pack is {total / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB a lent GPU machine "
                      f"takes ({len(wheels)} wheels); nothing written to {out}")
    return total


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file())):
        raise Refused(f"{out} exists and is not a pack written by make gpu-pack (no {MARKER}); remove it or "
                      f"choose another --out")


def build(out: Path, limit: int = LIMIT) -> dict:
    """Write the pack to ``out`` (replacing an earlier pack) and return its manifest."""
    out = out.resolve()
    _check_out(out)
    pack, base = plan()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        download(pack, tmp)
        _check_size(tmp, limit, out)  # before building ours: a refusal costs only the download
        build_own_wheel(tmp)
        wheels = sorted(tmp.glob("*.whl"))
        total = _check_size(tmp, limit, out)
        manifest = {
            "python": "3.12", "platform": "x86_64 Linux (manylinux)", "total_bytes": total,
            "base": {"names": list(BASE), "with_dependencies": sorted(base),
                     "note": "expected on the GPU machine; not in the pack"},
            "carried_from_base": CARRIED, "excluded": EXCLUDED,
            "wheels": [{"file": w.name, "bytes": w.stat().st_size, "sha256": _sha256(w)} for w in wheels],
            "pinned": dict(sorted(pack.items())),
        }
        (tmp / MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def tree_bytes() -> int | None:
    """Bytes of what the lent machine copies besides carried folders: tracked and untracked, not ignored files."""
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                          capture_output=True)
    if proc.returncode:
        return None
    return sum((REPO / f).stat().st_size for f in proc.stdout.decode().split("\0") if f and (REPO / f).is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"pack folder (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--limit-mib", type=float, default=LIMIT / 2**20, help="refuse a pack larger than this")
    args = p.parse_args(argv)
    try:
        manifest = build(args.out, int(args.limit_mib * 2**20))
    except Refused as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    total = manifest["total_bytes"]
    sys.stdout.write(f"gpu pack: {len(manifest['wheels'])} wheels, {total / 2**20:.1f} MiB "
                     f"(limit {args.limit_mib:.0f} MiB) in {args.out}\n")
    tree = tree_bytes()
    if tree is not None:  # the lent machine's 64 MiB hold the working tree and the carried pack together
        both = (tree + total) / 2**20
        sys.stdout.write(f"with the working tree ({tree / 2**20:.1f} MiB): {both:.1f} MiB of the 64 MiB a lent "
                         f"GPU machine takes{'; TOO LARGE to send there as it is' if both > 64 else ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
