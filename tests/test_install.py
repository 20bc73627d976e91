"""``pip install .`` into an environment of one's own: the environment's torch and transformers stay.

The environment is a fresh virtualenv (``--system-site-packages``) that also sees the project's ``.venv`` (a Python
that already has torch, transformers and megatron-core: a stand-in for an NGC container or a cluster's module),
through a ``.pth`` file. pip installs the project from a copy of the source with ``--no-index`` (nothing may be
fetched: what the environment has must satisfy pyproject.toml's dependencies) and ``--no-build-isolation``; torch's
version and files must be what they were, nothing named torch may land in the new environment, and the installed
command runs. pyproject.toml's ranges must admit the versions a user's environment has beside the locked ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# what pip sees (the distributions' versions) and what Python imports (the modules' files), without importing them
PROBE = ("import json, importlib.metadata as md, importlib.util as u; print(json.dumps({n: [md.version(n.replace("
         "'.', '-')), u.find_spec(n).origin] for n in ('torch', 'transformers', 'megatron.core')}))")


def _dependencies() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, deps)}


def _locked() -> dict[str, str]:
    lines = (ROOT / "requirements" / "lock.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_ranges_admit_compatible_versions_and_start_at_the_lock():
    """torch and transformers are ranges (an exact pin makes pip replace a container's torch); their lower ends
    are the locked versions make installs; megatron-core stays the exact version the seam is written against."""
    deps, locked = _dependencies(), _locked()
    for name, newer in (("torch", ("2.15.1", "2.16.0", "2.20.0")), ("transformers", ("5.23.1", "5.30.0"))):
        spec = deps[name].specifier
        assert locked[name] in spec, (name, str(spec), locked[name])
        assert all(v in spec for v in newer), (name, str(spec))  # fails for "==": the user's newer build refused
        lower = next(s.version for s in spec if s.operator == ">=")
        assert [int(x) for x in lower.split(".")] == [int(x) for x in locked[name].split(".")][:len(lower.split("."))]
    assert str(deps["megatron-core"].specifier) == f"=={locked['megatron-core']}"


def test_make_installs_the_locked_set_with_the_dev_extra():
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c $(LOCK) -e '.[dev]'" in makefile and "LOCK  := requirements/lock.txt" in makefile
    import importlib.metadata as md

    locked = _locked()
    for name in ("torch", "transformers", "megatron-core", "tokenizers", "numpy", "pytest"):
        assert md.version(name) == locked[name], name  # the .venv running this suite is the locked set
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"dev", "test", "wandb", "mlflow", "te"} <= set(extras)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs the project's virtualenv as the torch environment")
def test_pip_install_next_to_a_preinstalled_torch_keeps_it(tmp_path):
    env_dir, src = tmp_path / "env", tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "bio_megatron", src / "bio_megatron", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the environment's torch
    before = json.loads(subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, check=True,
                                       timeout=300).stdout)
    assert Path(before["torch"][1]).is_relative_to(sys.prefix)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index",
                           "--no-build-isolation", "--no-cache-dir", str(src)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = json.loads(subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, check=True,
                                      timeout=300).stdout)
    assert after == before
    new = sorted(x.name for x in site.iterdir())
    assert not [n for n in new if n.startswith(("torch", "transformers", "megatron"))], new
    assert (site / "bio_megatron").is_dir()  # the project itself went into the new environment
    help_out = subprocess.run([str(env_dir / "bin" / "bio-megatron"), "--help"], capture_output=True, text=True,
                              timeout=300)
    assert help_out.returncode == 0 and help_out.stdout.startswith("usage: bio-megatron"), help_out.stderr[-2000:]
