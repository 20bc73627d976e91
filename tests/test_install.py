"""``pip install .`` into an environment of one's own: the environment's torch and transformers stay.

The environment is a fresh virtualenv (``--system-site-packages``) that also sees the project's ``.venv`` (a Python
that already has torch, transformers and megatron-core: a stand-in for an NGC container or a cluster's module),
through a ``.pth`` file, first without transformers (the ``[hf]`` extra; tests/without_hf.py). pip installs the
project from a copy of the source with ``--no-index`` (nothing may be fetched: what the environment has must satisfy
pyproject.toml's dependencies) and ``--no-build-isolation``; torch's version and files must be what they were,
nothing named torch may land in the new environment, and the installed command runs; then ``.[hf]`` with
transformers present keeps it too, and ``.[wandb,mlflow]`` takes the environment's trackers. pyproject.toml's ranges must admit the versions a user's environment has beside
the locked ones."""

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
from without_hf import SITE, site_without_transformers

ROOT = Path(__file__).resolve().parents[1]
# what pip sees (the distributions' versions) and what Python imports (the modules' files), without importing them
# (None for a module the environment lacks)
PROBE = ("import json, importlib.metadata as md, importlib.util as u; print(json.dumps({n: [md.version(n.replace("
         "'.', '-')), u.find_spec(n).origin] if u.find_spec(n) else None for n in ('torch', 'transformers', "
         "'megatron.core')}))")


def _dependencies() -> dict[str, Requirement]:
    """The core dependencies and the [hf] extra's (transformers)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {r.name: r for r in map(Requirement, project["dependencies"] + project["optional-dependencies"]["hf"])}


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
    assert {"dev", "test", "hf", "wandb", "mlflow", "te"} <= set(extras)


def _run(args: list, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def _probe(py: Path) -> dict:
    return json.loads(subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, check=True,
                                     timeout=300).stdout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh virtualenv that sees this venv's packages except transformers, the project installed into it with
    ``pip install .``; the environment as probed before and after, and the paths."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the project's virtualenv as the torch environment")
    tmp = tmp_path_factory.mktemp("install")
    env_dir, src = tmp / "env", tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "bio_megatron", src / "bio_megatron", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the environment's torch and the rest, without transformers
    (site / "preinstalled.pth").write_text(str(site_without_transformers(tmp / "preinstalled")) + "\n")
    before = _probe(py)
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "--no-index", "--no-build-isolation",
           "--no-cache-dir"]
    done = _run([*pip, src], timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"tmp": tmp, "src": src, "py": py, "cli": env_dir / "bin" / "bio-megatron", "site": site, "pip": pip,
            "before": before, "after": _probe(py), "preinstalled": tmp / "preinstalled"}


def test_pip_install_next_to_a_preinstalled_torch_keeps_it(installed):
    """No transformers in the environment, and ``pip install .`` needs none (the [hf] extra); torch stays the
    environment's, and ``export hf`` names the extra in one line (exit 2) where it is missing."""
    before, after, site, cli, tmp = (installed[k] for k in ("before", "after", "site", "cli", "tmp"))
    assert Path(before["torch"][1]).is_relative_to(installed["preinstalled"]) and before["transformers"] is None
    assert after == before
    new = sorted(x.name for x in site.iterdir())
    assert not [n for n in new if n.startswith(("torch", "transformers", "megatron"))], new
    assert (site / "bio_megatron").is_dir()  # the project itself went into the new environment
    # the recipes came with it: `--config tiny` and `bio-megatron demo` find them without a checkout
    found = _run([installed["py"], "-I", "-c", "from bio_megatron.config.recipes import find_recipe; "
                  "print(find_recipe('pretrain', 'tiny'))"])
    recipe = Path(found.stdout.strip())
    assert found.returncode == 0 and recipe.is_file() and recipe.is_relative_to(site), (found.stdout, found.stderr)
    help_out = _run([cli, "--help"])
    assert help_out.returncode == 0 and help_out.stdout.startswith("usage: bio-megatron"), help_out.stderr[-2000:]
    export = _run([cli, "export", "hf", "--checkpoint", tmp / "run", "--out", tmp / "hf"])
    assert (export.returncode, export.stdout, export.stderr.strip().count("\n")) == (2, "", 0), export
    assert "bio-megatron export hf needs transformers, which is not installed: pip install 'bio-megatron[hf]'" \
        in export.stderr and not (tmp / "hf").exists()
    # the tracker extras name real distributions in ranges the environment's wandb and mlflow-skinny meet: pip
    # takes them from the environment (no index), replacing nothing
    trackers = _run([*installed["pip"], f"{installed['src']}[wandb,mlflow]"], timeout=600)
    assert trackers.returncode == 0, trackers.stdout[-3000:] + trackers.stderr[-3000:]
    assert _probe(installed["py"]) == before
    assert not [n for n in sorted(x.name for x in site.iterdir()) if n.startswith(("wandb", "mlflow", "torch"))]
    imported = _run([installed["py"], "-c", "import wandb, mlflow; print(wandb.__version__, mlflow.__version__)"])
    assert imported.returncode == 0, imported.stderr[-2000:]


# Two fresh processes importing torch and megatron-core, and a second install: ~15 s on CI's two cores; the default
# suite runs these commands without transformers in tests/test_optional_hf.py.
@pytest.mark.extended
def test_the_core_path_runs_without_transformers_and_the_hf_extra_keeps_it(installed, pubmed_prefix):
    cli, tmp, site, py = (installed[k] for k in ("cli", "tmp", "site", "py"))
    dry = _run([cli, "pretrain", "--config", ROOT / "nemo_configs" / "pretrain" / "tiny.yaml", "--dry-run",
                f"model.data.data_prefix=[{pubmed_prefix}]", f"exp_manager.exp_dir={tmp / 'runs'}"])
    assert dry.returncode == 0 and json.loads(dry.stdout)["data"]["tokens"] > 0, dry.stderr[-3000:]
    ft = _run([cli, "finetune", "ner", "--config", ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml", "--dry-run",
               f"model.dataset.data_dir={ROOT / 'tests' / 'fixtures' / 'finetune'}"])
    assert ft.returncode == 0, ft.stderr[-3000:]

    # transformers arrives (the environment's own files, as a container's): [hf] takes it and keeps it
    hf_only, pth = tmp / "hf_only", site / "preinstalled_hf.pth"
    hf_only.mkdir()
    for entry in SITE.iterdir():
        if entry.name == "transformers" or entry.name.startswith("transformers-"):
            (hf_only / entry.name).symlink_to(entry)
    pth.write_text(f"{hf_only}\n")
    try:
        before = _probe(py)
        assert Path(before["transformers"][1]).is_relative_to(hf_only), before
        done = _run([*installed["pip"], f"{installed['src']}[hf]"], timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert _probe(py) == before
        assert not [n for n in sorted(x.name for x in site.iterdir()) if n.startswith(("torch", "transformers"))]
    finally:
        pth.unlink()  # the module's environment is again the one without transformers


def test_the_te_extra_resolves_next_to_the_environment_s_torch(tmp_path):
    """``pip install '.[te]'``, resolved against the package index in this environment (``--dry-run``; no build
    isolation, as Transformer Engine's own instructions say: ``transformer_engine_torch``'s requirements are computed
    against the installed torch and its CUDA): Transformer Engine's packages in the ``[te]`` range come, and nothing
    the environment has is replaced (torch, transformers, megatron-core, numpy). Whether TE then runs needs a GPU
    (``docs/DEVELOPMENT.md``). Needs the index: a failure under CI, a skip elsewhere."""
    import os

    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run",
                           "--no-build-isolation", "--quiet", "--report", str(report), f"{ROOT}[te]"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        message = f"pip could not resolve .[te] against the index: {done.stderr.strip()[-400:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    install = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
               for i in json.loads(report.read_text())["install"]}
    (te,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["te"]
    te = Requirement(te)
    assert install.get("transformer-engine") in te.specifier, install
    assert "transformer-engine-torch" in install, install  # the [pytorch] extra's part, built for this torch
    assert not set(install) & {"torch", "transformers", "megatron-core", "numpy"}, install
