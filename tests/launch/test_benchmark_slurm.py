"""``bio-megatron benchmark ... --launcher slurm`` on the real 2-node SLURM cluster (conftest.py).

A BLURB suite of two cells (GAD, BIOSSES; one seed; the tiny CPU recipes and real data slices of
tests/benchmark/suite_files.py, a random MegatronBert as the model) is submitted as it is on a real
cluster: one array task per cell running ``slurm/benchmark.sbatch`` (bare metal, the default
``LAUNCHER=srun``: each cell's fine-tuning is an srun step on its node), then the report job. The same
suite runs locally at the same time; every cell's scores and both tables must be the same. Then one cell
is deleted and the same command submitted again, in container mode (``CONTAINER_IMAGE``: the pyxis
stand-in logs the ``--container-*`` flags srun gave the task): only that cell is submitted and redone.
The commands are in docs/BENCHMARK_SUITES.md (test_docs_show_the_tested_commands checks that).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import start_world
from launch_cmds import REPO

sys.path.insert(0, str(REPO / "tests" / "benchmark"))
from suite_files import blurb_map, make_model, write_map  # noqa: E402

SUITE = ("bio-megatron benchmark blurb --model $MODEL --out $OUT --recipe-map $MAP --datasets gad,biosses --seeds 1 "
         "--no-grid --epochs 1 --max-examples 16")
# One node per cell, one process on it (fake GPUs: CUDA_VISIBLE_DEVICES only); the arrays' logs go to $RUNS
# (sbatch reads SBATCH_OUTPUT; the report job names its own, in the suite folder).
SLURM_SUITE = (f'SBATCH_OUTPUT=$RUNS/%x-%A_%a.out {SUITE} --launcher slurm '
               '--sbatch-args "--nodes=1 --ntasks-per-node=1 --gpus-per-node=1"')
PYXIS_SUITE = ("LAUNCHER=local CONTAINER_IMAGE=bio-megatron:latest CONTAINER_MOUNTS=$OUT:$OUT,$MODEL:$MODEL "
               f"CONTAINER_WORKDIR=$PWD {SLURM_SUITE}")
DOC_COMMANDS = (SLURM_SUITE, PYXIS_SUITE)
ARGV = ["benchmark", "blurb", "--datasets", "gad,biosses", "--seeds", "1", "--no-grid", "--epochs", "1",
        "--max-examples", "16"]
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def suite_env():
    """The model and the recipe map in a folder the jobs see (/tmp: same filesystem, the jobs run as root)."""
    root = Path(tempfile.mkdtemp(prefix="bm-bench-", dir="/tmp"))
    model = make_model(root / "tiny-megatron-bert")
    env = {"MODEL": str(model), "MAP": str(write_map(root / "map.yaml", blurb_map()))}
    yield root, env
    shutil.rmtree(root, ignore_errors=True)


def _suite(argv: list[str]) -> int:
    from bio_megatron.cli import main

    os.chdir(REPO)
    return main(argv)


def array_tasks(cluster, job: str) -> dict[int, dict[str, str]]:
    """scontrol's record of every task of an array job (one line each), by array index."""
    out = cluster.sh(f"scontrol show job -o {job}")
    recs = [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in out.splitlines() if line.strip()]
    return {int(r["ArrayTaskId"]): r for r in recs}


def wait_for_suite(cluster, ids: list[str], runs: Path) -> dict[int, dict[str, str]]:
    """Wait for the report job (it runs after the arrays, whatever they did); the array tasks' records."""
    *arrays, report = ids
    info = cluster.wait_done(report, timeout=300)
    tasks = {k: v for a in arrays for k, v in array_tasks(cluster, a).items()}
    logs = "\n".join(p.read_text()[-3000:] for p in runs.glob("bio-megatron-benchmark-*.out"))
    assert all(t["JobState"] == "COMPLETED" and t["ExitCode"] == "0:0" for t in tasks.values()), (tasks, logs)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, cluster.job_log(info))
    return tasks


def submit(cluster, command: str, env: dict[str, str]) -> list[str]:
    out = cluster.sh(command, env, timeout=120)
    m = re.search(r"submitted: ([\d ]+);", out)
    assert m, out
    ids = m.group(1).split()
    cluster.jobs.extend(ids)
    return ids


def cell(out: Path, key: str) -> Path:
    return out / "cells" / key / "seed1"


def launches(c: Path) -> int:
    """How many times the cell's fine-tuning started (each start writes its command line first)."""
    log = c / "finetune.log"
    return sum(ln.startswith("$ ") and " finetune " in ln for ln in log.read_text().splitlines()) if log.exists() else 0


def comparable(results: dict) -> dict:
    """results.json minus what differs between two folders by construction (their paths, wall times)."""
    drop = ("run_dir", "wall_seconds", "out", "dir", "model", "suite_dir")
    clean = lambda v: ({k: clean(x) for k, x in v.items() if k not in drop} if isinstance(v, dict)  # noqa: E731
                       else [clean(x) for x in v] if isinstance(v, list) else v)
    return clean(results)


@pytest.mark.slurm
def test_benchmark_suite_as_a_slurm_job_array(slurm_cluster, runs_dir, suite_env):
    root, files = suite_env
    out, local = runs_dir / "bench-slurm", root / "bench-local"
    env = {**files, "OUT": str(out), "RUNS": str(runs_dir)}
    ids = submit(slurm_cluster, SLURM_SUITE, env)
    assert len(ids) == 2, ids  # one array (no cell continues another) and the report
    # The same cells here meanwhile, one process forking each cell (as `bio-megatron benchmark` with no launcher).
    world = start_world(1, _suite, ARGV[:2] + ["--model", files["MODEL"], "--out", str(local),
                                               "--recipe-map", files["MAP"]] + ARGV[2:])
    tasks = wait_for_suite(slurm_cluster, ids, runs_dir)
    assert world.join(300) == [0]

    plan = {c["dataset"]: c["index"] for c in json.loads((out / "plan.json").read_text())["cells"]}
    assert sorted(tasks) == sorted(plan.values()) == [0, 1], (tasks, plan)
    # Both cells at once, one per node (the script asks for a whole node per cell).
    assert {t["NodeList"] for t in tasks.values()} == {"node1", "node2"}, tasks
    for key in ("gad", "biosses"):
        log = (runs_dir / f"bio-megatron-benchmark-{ids[0]}_{plan[key]}.out").read_text()
        assert "launcher=srun, container=none" in log and f"--cell {plan[key]} --launcher srun" in log, log
        # the cell's fine-tuning was an srun step of the array task, one rank on its node
        assert "$ srun --kill-on-bad-exit=1 --wait=60 --nodes=1 --ntasks-per-node=1 --ntasks=1" in \
            (cell(out, key) / "finetune.log").read_text()
        assert launches(cell(out, key)) == 1
        got, want = (json.loads((cell(d, key) / "cell.json").read_text()) for d in (out, local))
        assert (got["raw"], got["scores"], got["dev_value"]) == (want["raw"], want["scores"], want["dev_value"]), key
    assert (out / "results.md").read_text() == (local / "results.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["cells_finished"] == results["cells_total"] == 2
    assert comparable(results) == comparable(json.loads((local / "results.json").read_text()))

    # One cell lost: the same command (now in a container) submits that cell alone; the other is not touched.
    gad = cell(out, "gad")
    kept = {f: f.stat().st_mtime_ns for f in (gad / "cell.json", gad / "finetune.log")}
    shutil.rmtree(cell(out, "biosses"))
    (out / "results.md").unlink()
    ids = submit(slurm_cluster, PYXIS_SUITE, env)
    tasks = wait_for_suite(slurm_cluster, ids, runs_dir)
    assert sorted(tasks) == [plan["biosses"]], tasks
    assert {f: f.stat().st_mtime_ns for f in kept} == kept and launches(gad) == 1
    assert launches(cell(out, "biosses")) == 1
    log = (runs_dir / f"bio-megatron-benchmark-{ids[0]}_{plan['biosses']}.out").read_text()
    assert "launcher=local, container=bio-megatron:latest" in log, log
    job = tasks[plan["biosses"]]["JobId"]
    flags = {}
    for line in slurm_cluster.pyxis_log.read_text().splitlines():
        if line.startswith(f"job={job} "):
            _, task, opt = line.split()
            k, v = opt.split("=", 1)
            flags.setdefault(task, {})[k] = v
    assert flags == {"task=0": {"container-image": "bio-megatron:latest", "container-workdir": str(REPO),
                                "container-mounts": f"{out}:{out},{files['MODEL']}:{files['MODEL']}",
                                "no-container-mount-home": "1"}}, flags
    assert (out / "results.md").read_text() == (local / "results.md").read_text()
    assert comparable(json.loads((out / "results.json").read_text())) == comparable(
        json.loads((local / "results.json").read_text()))


def test_docs_show_the_tested_commands():
    doc = (REPO / "docs" / "BENCHMARK_SUITES.md").read_text()
    missing = [c for c in DOC_COMMANDS if c not in doc]
    assert not missing, f"docs/BENCHMARK_SUITES.md lacks the tested commands: {missing}"


@pytest.mark.parametrize("env, message", [
    ({"LAUNCHER": "srun"}, "LAUNCHER=srun needs srun where the suite runs: bare metal only"),
    ({"SLURM_NNODES": "2"}, "with CONTAINER_IMAGE a cell runs on one node; the job has 2"),
])
def test_benchmark_sbatch_container_mode_fails_fast(env, message):
    """Container mode: what cannot work inside the image is refused before any srun (no cluster needed)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", "slurm/benchmark.sbatch", "paper", "--model", "x"], cwd=REPO, capture_output=True,
                         env={**base, "SLURM_JOB_ID": "7", "CONTAINER_IMAGE": "bio-megatron:latest", **env},
                         text=True, timeout=30)
    assert res.returncode == 2 and message in res.stderr, (res.returncode, res.stderr)
