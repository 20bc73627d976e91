"""Fixtures for the launch tests: a real 2-node SLURM cluster on this host, a tiny real corpus, and a
single-host torchrun reference run that the SLURM runs must reproduce.

The cluster comes from ``slurm_ci/slurm_up.sh`` (vendored from ../shared/reference/slurm-ci):
slurmctld + two ``slurmd -N nodeK`` in a private network namespace with only loopback, node names
resolving to 127.0.0.1, fake GPUs as gres, and the no-op pyxis SPANK plugin loaded so the
``--container-*`` flags are accepted and logged. ``slurm_down.sh`` stops every daemon and job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "slurm_ci"
VENV_BIN = Path(sys.executable).parent

from launch_cmds import (DATA_COMMANDS, IMAGE, IMAGE_BASE_COMMAND, IMAGE_BUILD_COMMAND, REFERENCE_COMMAND,
                         REPO, run_command)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(ok: bool, reason: str) -> None:
    """Skip when a system prerequisite is missing, but fail under CI so CI can never silently skip."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI=true but {reason} (tests/system_deps.sh should have installed it)", pytrace=False)
    pytest.skip(reason)


def missing_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (slurmd, network namespace, /etc/hosts)"
    tools = ("slurmctld", "slurmd", "sbatch", "scontrol", "munged", "nsenter", "ip", "gcc")
    missing = [t for t in tools if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    if missing:
        return f"slurmctld/slurmd/munge not installed (missing: {', '.join(missing)}); run tests/system_deps.sh"
    if not Path("/usr/include/slurm/spank.h").exists():
        return "SPANK headers (libslurm-dev) not installed; run tests/system_deps.sh"
    return None


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    pyxis_log: Path
    jobs: list[str] = field(default_factory=list)

    def sh(self, command: str, extra_env: dict[str, str] | None = None, timeout: float = 60) -> str:
        """Run a shell command as a user would type it (repo root, cluster's sbatch/scontrol on PATH)."""
        env = {**self.env, **(extra_env or {})}
        res = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=timeout)
        assert res.returncode == 0, f"{command!r} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        return res.stdout

    def submit(self, command: str, extra_env: dict[str, str]) -> str:
        out = self.sh(command, extra_env)
        m = re.search(r"Submitted batch job (\d+)", out)
        assert m, out
        self.jobs.append(m.group(1))
        return m.group(1)

    def job(self, job_id: str) -> dict[str, str]:
        out = self.sh(f"scontrol show job -o {job_id}")
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: str, until, timeout: float, what: str) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if until(info):
                return info
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id}: not {what} after {timeout:.0f}s: {info.get('JobState')}\n"
                            f"{self.job_log(info, 6000)}", pytrace=False)
            time.sleep(0.5)

    def wait_done(self, job_id: str, timeout: float = 240) -> dict[str, str]:
        return self.wait(job_id, lambda j: j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                             "NODE_FAIL", "OUT_OF_MEMORY"),
                         timeout, "finished")

    @staticmethod
    def job_log(info: dict[str, str], tail: int | None = None) -> str:
        path = Path(info.get("StdOut", "/nonexistent"))
        text = path.read_text() if path.exists() else f"(no job log at {path})"
        return text[-tail:] if tail else text


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = missing_slurm()
    require(reason is None, reason or "")
    # Not under pytest's tmp dir: munged runs as user munge and must traverse every parent directory.
    root = Path(tempfile.mkdtemp(prefix="bm-slurm-", dir="/tmp"))
    root.chmod(0o755)
    pyxis_so, pyxis_log = root / "fake_pyxis.so", root / "pyxis.log"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(pyxis_so),
                    str(HARNESS / "fake_pyxis.c")], check=True)
    env_vars = {"SLURM_CI_ROOT": str(root / "cluster"), "SLURM_CI_NODES": "2", "SLURM_CI_CPUS_PER_NODE": "8",
                "SLURM_CI_FAKE_GPUS_PER_NODE": "2", "SLURM_CI_NETNS": f"bmslurm{os.getpid()}",
                "SLURM_CI_SPANK_SO": f"{pyxis_so} log={pyxis_log}"}
    up_env = {**os.environ, **env_vars}
    cluster = None
    try:
        subprocess.run(["bash", str(HARNESS / "slurm_up.sh")], env=up_env, check=True, timeout=120,
                       capture_output=True, text=True)
        env = {**os.environ, "SLURM_CONF": str(root / "cluster" / "slurm.conf"),
               "PATH": f"{root / 'cluster' / 'bin'}:{VENV_BIN}:{os.environ.get('PATH', '')}"}
        cluster = SlurmCluster(root=root, env=env, pyxis_log=pyxis_log)
        yield cluster
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"slurm_up.sh failed:\n{exc.stdout}\n{exc.stderr}", pytrace=False)
    finally:
        subprocess.run(["bash", str(HARNESS / "slurm_down.sh")], env=up_env, timeout=120,
                       capture_output=True, text=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_corpus() -> Path:
    """The bundled real PubMed sample, extracted and tokenized to <dir>/pubmed.{bin,idx}."""
    # Shared with the SLURM jobs (which run as root in another network namespace, same filesystem).
    data = Path(tempfile.mkdtemp(prefix="bm-data-", dir="/tmp"))
    env = {**os.environ, "DATA": str(data), "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
    for command in DATA_COMMANDS:
        res = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{command} failed:\n{res.stdout}\n{res.stderr}"
    assert (data / "pubmed.bin").stat().st_size > 0 and (data / "pubmed.idx").exists()
    yield data
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def runs_dir() -> Path:
    runs = Path(tempfile.mkdtemp(prefix="bm-runs-", dir="/tmp"))
    yield runs
    shutil.rmtree(runs, ignore_errors=True)


@pytest.fixture(scope="session")
def reference_run(slurm_cluster: SlurmCluster, tiny_corpus: Path, runs_dir: Path) -> Path:
    env = {**slurm_cluster.env, "DATA": str(tiny_corpus), "RUNS": str(runs_dir), "OMP_NUM_THREADS": "1"}
    # Inside the cluster's network namespace (only loopback), so torchrun's store and gloo listen on
    # nothing but loopback, like everything else the tests start.
    ns = slurm_cluster.root / "cluster" / "bin" / "slurm-ns"
    res = subprocess.run([str(ns), "bash", "-c", REFERENCE_COMMAND], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"reference torchrun run failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    run = runs_dir / "reference"
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    return run


PODMAN_CONF = Path(__file__).resolve().parent / "podman-containers.conf"


def missing_podman() -> str | None:
    if os.geteuid() != 0:
        return "building the image with podman needs root here"
    missing = [t for t in ("podman", "debootstrap", "readelf") if shutil.which(t) is None
               and not Path("/usr/sbin", t).exists()]
    if missing:
        return f"podman/debootstrap/binutils not installed (missing: {', '.join(missing)}); run tests/system_deps.sh"
    if not (REPO / ".venv" / "bin" / "python").exists():
        return "no .venv in the checkout (the image's base is made from it): run `make test`"
    return None


@pytest.fixture(scope="module")
def podman_env() -> dict[str, str]:
    reason = missing_podman()
    require(reason is None, reason or "")
    return {**os.environ, "CONTAINERS_CONF": str(PODMAN_CONF)}


# --- The image is built in the background from the start of the session --------------------------------------
# Making the base on a fresh machine takes minutes of mostly network (debootstrap) and disk (podman import)
# time; the project image then builds in seconds. Both start as soon as collection ends, at low CPU and I/O
# priority, while the rest of the suite runs, and the image tests run last; the `image` fixture waits for them.
# One build per test run: under pytest-xdist (`make test`) every worker collects the image tests, but only the
# worker that creates the run's build log starts it (two builds would hard-link and archive the same files at
# once); the worker that runs the image tests waits for the build's exit-code file and removes both files.
IMAGE_TESTS = "test_image.py"
BUILD_COMMAND = f"({IMAGE_BASE_COMMAND}) && ({IMAGE_BUILD_COMMAND})"
_BUILD: dict[str, subprocess.Popen] = {}
# the workers of one xdist run share its id; a plain run gets its own (a PID could be a killed run's, whose
# files would then be taken for a build in progress)
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def _build_files() -> tuple[Path, Path]:
    return Path(f"/tmp/bm-image-build-{_RUN_ID}.log"), Path(f"/tmp/bm-image-build-{_RUN_ID}.rc")


def pytest_collection_modifyitems(config, items) -> None:
    image = [i for i in items if i.path.name == IMAGE_TESTS]
    if image:
        items[:] = [i for i in items if i.path.name != IMAGE_TESTS] + image


def pytest_collection_finish(session) -> None:
    if session.config.option.collectonly or missing_podman() is not None:
        return
    if not any(i.path.name == IMAGE_TESTS for i in session.items):
        return
    log, rc = _build_files()
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # another worker of this run started it
    with os.fdopen(fd, "w") as fh:
        _BUILD["proc"] = subprocess.Popen(["nice", "-n", "10", "ionice", "-c", "2", "-n", "7", "bash", "-c",
                                           f"{BUILD_COMMAND}; echo $? >{rc}.tmp && mv {rc}.tmp {rc}"], cwd=REPO,
                                          env={**os.environ, "CONTAINERS_CONF": str(PODMAN_CONF)}, stdout=fh,
                                          stderr=subprocess.STDOUT, start_new_session=True)


def pytest_sessionfinish(session, exitstatus) -> None:
    proc = _BUILD.get("proc")
    if proc is None:
        return
    stopped = exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldstop or session.shouldfail
    if proc.poll() is None and os.environ.get("PYTEST_XDIST_WORKER") and not stopped:
        proc.wait(timeout=1800)  # another worker may be about to run the image tests on it
    if proc.poll() is None:  # the session ended before the image tests
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
    if stopped or not os.environ.get("PYTEST_XDIST_WORKER"):
        for path in _build_files():
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str]) -> str:
    # The base is kept between runs (labelled with a hash of what it is made of, rebuilt when that
    # changes: ~2 min); the project image is rebuilt every time (seconds) and removed afterwards.
    log, rc_file = _build_files()
    if log.exists():
        deadline = time.time() + 1800
        while not rc_file.exists():
            assert time.time() < deadline, f"the image build ({log}) did not finish in 30 min"
            own = _BUILD.get("proc")
            assert own is None or own.poll() is None or rc_file.exists(), f"the image build died:\n{log.read_text()}"
            time.sleep(1)
        rc, text = int(rc_file.read_text()), log.read_text()
        rc_file.unlink()
        log.unlink()
        assert rc == 0, f"{BUILD_COMMAND!r} failed ({rc}):\n{text[-8000:]}"
    else:
        run_command(IMAGE_BASE_COMMAND, podman_env, timeout=1200)
        run_command(IMAGE_BUILD_COMMAND, podman_env, timeout=600)
    yield IMAGE
    subprocess.run(["podman", "rmi", "--force", IMAGE], env=podman_env, capture_output=True, timeout=120)
