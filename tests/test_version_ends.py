"""pyproject.toml's torch and transformers ranges, tested at both ends.

The lower end of each range is the locked version this suite runs on (``test_install.py`` holds them equal). The
upper end is the newest release the range admits on the package index CI installs from: where it is newer than the
lock, it goes into an overlay folder put in front of ``.venv`` on ``PYTHONPATH`` (with any of its requirements the
venv does not satisfy), and the tests of every family's Hugging Face interchange run again on it through the CLI:
import with transformers' own logits, export read back by transformers, ``import hf --verify``, the
token-classification pipeline. Where the newest release is the locked one, both ends are that version and the
suite above tested it.

Needs the package index (CI reaches it: it installs from it); elsewhere without it the test is skipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RANGED = ("torch", "transformers")
# one test per family of each interchange: enough to meet any transformers API the readers and writers use
FILES = ["tests/interchange/test_hf_import_verify.py", "tests/architectures/test_hf_bert.py",
         "tests/architectures/test_roberta_hf.py", "tests/architectures/test_electra_hf.py",
         "tests/families/test_albert.py", "tests/families/test_modernbert.py", "tests/finetune/test_export_pipeline.py"]
SELECT = ("logits_equal_transformers or loads_in_transformers_with_same_logits or import_hf_verify_of or "
          "pipeline_groups")


def _ranges() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = map(Requirement, project["dependencies"] + project["optional-dependencies"]["hf"])
    return {r.name: r for r in reqs if r.name in RANGED}


def _pip(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)


def newest_in_range(req: Requirement) -> Version:
    """The newest final release of ``req.name`` on the index that ``req``'s range admits."""
    done = _pip("index", "versions", req.name, timeout=120)
    line = next((x for x in done.stdout.splitlines() if x.startswith("Available versions:")), None)
    if done.returncode or line is None:
        message = f"the package index did not answer for {req.name}: {done.stderr.strip()[-300:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # CI installs from the index: not reaching it there is a failure, not a skip
        pytest.skip(message)
    versions = [Version(v) for v in re.split(r",\s*", line.split(":", 1)[1].strip())]
    return max(v for v in versions if not v.is_prerelease and v in req.specifier)


def _unsatisfied(dist_dir: Path, name: str) -> list[str]:
    """The requirements (no extras) of distribution ``name`` unpacked in ``dist_dir`` that this venv does not meet."""
    (info,) = dist_dir.glob(f"{name}-*.dist-info")
    missing = []
    for line in (info / "METADATA").read_text(encoding="utf-8").splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or Version(have) not in req.specifier:
            missing.append(str(req))
    return missing


def test_ranges_hold_at_their_newest_release(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the project's virtualenv")
    newer = {}
    for name, req in _ranges().items():
        newest, locked = newest_in_range(req), Version(metadata.version(name))
        assert newest >= locked, (name, str(newest), str(locked))  # the lock is inside its own range
        if newest > locked:
            newer[name] = newest
    if not newer:
        return  # both ends of every range are the locked versions the suite ran on
    overlay = tmp_path / "overlay"
    done = _pip("install", "--quiet", "--no-deps", "--target", str(overlay), *(f"{n}=={v}" for n, v in newer.items()))
    assert done.returncode == 0, done.stderr[-3000:]
    extra = [r for name in newer for r in _unsatisfied(overlay, name)]  # read from the overlay's own metadata
    if extra:
        done = _pip("install", "--quiet", "--no-deps", "--target", str(overlay), *extra)
        assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(overlay), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep), "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([sys.executable, "-c", "import importlib.metadata as md, sys; "
                            f"print(' '.join(md.version(n) for n in {sorted(newer)!r}))"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == [str(newer[n]) for n in sorted(newer)], probe.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not extended",
                          "-k", SELECT, *FILES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and " passed" in summary and "failed" not in summary, \
        f"{newer}: {run.stdout[-6000:]}{run.stderr[-2000:]}"
