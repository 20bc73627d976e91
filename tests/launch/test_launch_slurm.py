"""The real sbatch scripts on a real 2-node SLURM cluster (see conftest.py).

Every job is the tiny TP2 x DP2 CPU run (4 gloo ranks, 2 per "node") and must reproduce, loss for
loss, the same run started with torchrun on one host. The commands below are copied verbatim into
docs/LAUNCH.md (test_docs_commands checks that).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from launch_cmds import (DATA_COMMANDS, IMAGE_BASE_COMMAND, IMAGE_BUILD_COMMAND, IMAGE_HELP_COMMAND,
                         IMAGE_RUN_COMMAND, REFERENCE_COMMAND, REPO, TINY_OVERRIDES, read_metrics)

SBATCH = "sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --output=$RUNS/%x-%j.out"
SRUN_JOB = f"RECIPE=nemo_configs/pretrain/tiny.yaml EXP_DIR=$RUNS RUN_NAME=slurm-srun {SBATCH} slurm/pretrain.sbatch {TINY_OVERRIDES}"
PYXIS_TORCHRUN_JOB = (
    "LAUNCHER=torchrun CONTAINER_IMAGE=bio-megatron:latest CONTAINER_MOUNTS=$PWD:$PWD,$DATA:$DATA,$RUNS:$RUNS "
    f"CONTAINER_WORKDIR=$PWD RECIPE=nemo_configs/pretrain/tiny.yaml EXP_DIR=$RUNS RUN_NAME=slurm-pyxis-torchrun {SBATCH} slurm/pretrain.sbatch "
    f"{TINY_OVERRIDES}"
)
PREEMPT_JOB = f"RECIPE=nemo_configs/pretrain/tiny.yaml EXP_DIR=$RUNS RUN_NAME=slurm-preempt {SBATCH} slurm/pretrain.sbatch {TINY_OVERRIDES}"
# What a preempting scheduler or the time-limit warning (--signal=B:USR1@300) does.
PREEMPT_SIGNAL = "scancel --batch --signal=USR1 $JOB"
CANCEL_JOB = PREEMPT_JOB.replace("RUN_NAME=slurm-preempt", "RUN_NAME=slurm-cancel")
CANCEL = "scancel $JOB"
# Fine-tuning goes through the same launch code; a dry run on every rank checks the command it builds.
FINETUNE_DRY_RUN_JOB = (
    "TASK=ner RECIPE=nemo_configs/ner/tiny_ner.yaml EXP_DIR=$RUNS RUN_NAME=slurm-finetune "
    f"{SBATCH} slurm/finetune.sbatch --dry-run"
)

DOC_COMMANDS = (*DATA_COMMANDS, REFERENCE_COMMAND, SRUN_JOB, PYXIS_TORCHRUN_JOB, PREEMPT_JOB, PREEMPT_SIGNAL, CANCEL,
                FINETUNE_DRY_RUN_JOB, IMAGE_BASE_COMMAND, IMAGE_BUILD_COMMAND, IMAGE_HELP_COMMAND, IMAGE_RUN_COMMAND)


def assert_same_losses(run: Path, reference: Path) -> None:
    got, want = read_metrics(run), read_metrics(reference)
    assert sorted(got) == sorted(want) == list(range(1, 21)), (sorted(got), sorted(want))
    diffs = {s: abs(got[s] - want[s]) for s in want if abs(got[s] - want[s]) > 1e-6}
    assert not diffs, f"losses differ from the single-host torchrun run at steps {diffs}"


def assert_finished_checkpoint(run: Path, step: int = 20) -> None:
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == step, status
    assert (run / "checkpoints" / "latest").read_text().strip() == str(step)
    ckpt = run / "checkpoints" / f"iter_{step:07d}"
    assert (ckpt / "metadata.json").exists(), sorted(p.name for p in ckpt.iterdir())
    # TP2 x DP2: megatron dist-checkpointing writes one shard file per saving rank.
    assert len(list(ckpt.glob("*.distcp"))) >= 2, sorted(p.name for p in ckpt.iterdir())


def job_env(tiny_corpus: Path, runs_dir: Path, **extra: str) -> dict[str, str]:
    return {"DATA": str(tiny_corpus), "RUNS": str(runs_dir), **extra}


def assert_completed(cluster, job: str, info: dict[str, str], restarts: int = 0) -> str:
    log = cluster.job_log(info)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info['JobState']}\n{log[-6000:]}"
    assert info["NodeList"] == "node[1-2]" and info["NumNodes"] == "2", info
    assert info["Restarts"] == str(restarts), info
    # MASTER_ADDR/PORT derived from the job, not fixed.
    assert f"MASTER_ADDR=node1 MASTER_PORT={61000 + int(job) % 4536}" in log, log
    return log


@pytest.mark.slurm
@pytest.mark.slow
def test_sbatch_srun_two_nodes_matches_single_host_torchrun(slurm_cluster, reference_run, tiny_corpus, runs_dir):
    job = slurm_cluster.submit(SRUN_JOB, job_env(tiny_corpus, runs_dir))
    info = slurm_cluster.wait_done(job)
    log = assert_completed(slurm_cluster, job, info)
    assert "launcher=srun, container=none" in log and "--ntasks-per-node=2 --ntasks=4" in log, log
    run = runs_dir / "slurm-srun"
    assert_finished_checkpoint(run)
    assert_same_losses(run, reference_run)


def assert_pyxis_flags_reached_every_node(cluster, job: str, tiny_corpus: Path, runs_dir: Path) -> None:
    """The no-op pyxis SPANK plugin logs, per task, the --container-* options srun passed to it."""
    by_task: dict[str, dict[str, str]] = {}
    for line in cluster.pyxis_log.read_text().splitlines():
        if line.startswith(f"job={job} "):
            _, task, opt = line.split()
            k, v = opt.split("=", 1)
            by_task.setdefault(task, {})[k] = v
    # LAUNCHER=torchrun: one task per node.
    assert sorted(by_task) == ["task=0", "task=1"], by_task
    for opts in by_task.values():
        assert opts == {"container-image": "bio-megatron:latest",
                        "container-mounts": f"{REPO}:{REPO},{tiny_corpus}:{tiny_corpus},{runs_dir}:{runs_dir}",
                        "container-workdir": str(REPO), "no-container-mount-home": "1"}, opts


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("command, run_name", [
    # the same requeue path as the pyxis case below, launched with srun as test_sbatch_srun_two_nodes_... does;
    # extended: 50 s of the default suite
    pytest.param(PREEMPT_JOB, "slurm-preempt", id="srun-bare-metal", marks=pytest.mark.extended),
    pytest.param(PYXIS_TORCHRUN_JOB, "slurm-pyxis-torchrun", id="torchrun-pyxis"),
])
def test_preemption_checkpoints_requeues_and_resumes_to_the_same_loss(command, run_name, slurm_cluster, reference_run,
                                                                      tiny_corpus, runs_dir):
    env = job_env(tiny_corpus, runs_dir)
    job = slurm_cluster.submit(command, env)
    run = runs_dir / run_name
    wait_for_training(slurm_cluster, job, run)

    slurm_cluster.sh(PREEMPT_SIGNAL, {**env, "JOB": job})
    slurm_cluster.wait(job, lambda j: j["Restarts"] == "1", 120, "requeued")
    requeued_at = time.monotonic()

    # SLURM holds a requeued job (Reason=BeginTime, up to ~2 min) so the nodes can clean up; release
    # it sooner, but not within the same few seconds: slurmd revokes the old incarnation's job
    # credential with 1 s granularity, and a launch in that second fails ("Job credential revoked").
    def done_or_release(j: dict[str, str]) -> bool:
        if j["JobState"] == "PENDING" and j.get("Reason") == "BeginTime" and time.monotonic() - requeued_at > 3:
            slurm_cluster.sh(f"scontrol update JobId={job} StartTime=now || true")
        return j["JobState"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED")

    info = slurm_cluster.wait(job, done_or_release, 240, "finished")
    log = assert_completed(slurm_cluster, job, info, restarts=1)

    # First attempt: the batch shell got the signal, the trainers checkpointed and reported it.
    first, _, second = log.partition(f"job {job} restart 1:")
    assert second, log
    # The batch script reports the status.json the trainers wrote before it requeued the job.
    m = re.search(r"training step exited with 0, trainer state 'interrupted' at step (\d+)", first)
    assert m and "received SIGUSR1" in first and f"requeueing job {job}" in first, first
    step = int(m.group(1))
    assert 2 <= step < 20, step
    assert (run / "checkpoints" / f"iter_{step:07d}" / "metadata.json").exists()
    assert "trainer state 'finished'" in second, second
    # Second attempt resumed from that checkpoint instead of starting over: every step logged once.
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(ln)]
    assert sorted(steps) == list(range(1, 21)), steps
    assert_finished_checkpoint(run)
    if "CONTAINER_IMAGE" in command:
        assert "launcher=torchrun, container=bio-megatron:latest" in log, log
        assert_pyxis_flags_reached_every_node(slurm_cluster, job, tiny_corpus, runs_dir)
    # Interrupted + resumed == uninterrupted, step for step, down to the final loss.
    assert_same_losses(run, reference_run)


def wait_for_training(cluster, job: str, run: Path, min_step: int = 2) -> None:
    deadline = time.monotonic() + 240
    while not (run / "metrics.jsonl").exists() or max(read_metrics(run), default=0) < min_step:
        info = cluster.job(job)
        assert info["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), cluster.job_log(info, 6000)
        assert time.monotonic() < deadline, f"no training progress\n{cluster.job_log(info, 6000)}"
        time.sleep(0.3)


@pytest.mark.slurm
@pytest.mark.slow
def test_scancel_checkpoints_and_the_job_stays_cancelled(slurm_cluster, tiny_corpus, runs_dir):
    """scancel sends TERM too; the trainers checkpoint, but the job must not requeue itself."""
    env = job_env(tiny_corpus, runs_dir)
    job = slurm_cluster.submit(CANCEL_JOB, env)
    run = runs_dir / "slurm-cancel"
    wait_for_training(slurm_cluster, job, run)
    slurm_cluster.sh(CANCEL, {**env, "JOB": job})
    info = slurm_cluster.wait_done(job, timeout=60)
    time.sleep(2)  # a (wrong) requeue would show up as Restarts=1 / PENDING by now
    info = slurm_cluster.job(job)
    log = slurm_cluster.job_log(info)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", (info, log[-4000:])
    # (The batch shell's own "not requeueing" line may be cut off: SLURM SIGKILLs a cancelled job's
    # processes KillWait seconds after the TERM, 30 s on the test cluster.)
    assert "received SIGTERM" in log, log[-4000:]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "interrupted", status
    assert (run / "checkpoints" / "latest").read_text().strip() == str(status["step"])


@pytest.mark.slurm
def test_finetune_sbatch_runs_the_finetune_cli_on_every_rank(slurm_cluster, tiny_corpus, runs_dir):
    job = slurm_cluster.submit(FINETUNE_DRY_RUN_JOB, job_env(tiny_corpus, runs_dir))
    info = slurm_cluster.wait_done(job, timeout=180)
    log = assert_completed(slurm_cluster, job, info)
    assert (f"bio-megatron finetune ner --config nemo_configs/ner/tiny_ner.yaml --dry-run "
            f"exp_manager.exp_dir={runs_dir} exp_manager.name=slurm-finetune") in log, log
    # Each of the 4 ranks (2 per node) printed the resolved recipe with the run directory the script
    # chose. srun interleaves the ranks' output line by line, so count lines, not JSON documents.
    lines = [ln.strip() for ln in log.splitlines()]
    for line in ('"task": "ner",', '"name": "tiny_ner",', f'"exp_dir": "{runs_dir}",', '"name": "slurm-finetune",'):
        assert lines.count(line) == 4, (line, log[-4000:])


def test_docs_commands_are_the_tested_commands():
    doc = (REPO / "docs" / "LAUNCH.md").read_text()
    missing = [c for c in DOC_COMMANDS if c not in doc]
    assert not missing, f"docs/LAUNCH.md lacks the tested commands: {missing}"
    # The README's SLURM section repeats the tested tiny run: it must stay the same commands.
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Run on a SLURM cluster")
    section = readme[start:readme.index("\n## ", start)]
    shown = [ln for ln in section.splitlines() if ln.startswith(("bio-megatron ", "RECIPE=", "LAUNCHER=", "torchrun "))]
    assert shown and all(ln in DOC_COMMANDS for ln in shown), [ln for ln in shown if ln not in DOC_COMMANDS]


@pytest.mark.parametrize("env, message", [
    ({}, "not inside a SLURM job"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "LAUNCHER": "mpirun"},
     "LAUNCHER must be srun or torchrun, got 'mpirun'"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "RECIPE": "nope.yaml"},
     "RECIPE 'nope.yaml' not found"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "4",
      "GPUS_PER_NODE": "8"}, "LAUNCHER=srun needs --ntasks-per-node=8"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "VENV": "/nonexistent"},
     "VENV '/nonexistent' is not a virtual environment"),
])
@pytest.mark.parametrize("script", ["slurm/pretrain.sbatch", "slurm/finetune.sbatch"])
def test_sbatch_fails_fast_with_a_clear_message(script, env, message, tmp_path):
    """The defaults (recipes, .venv) exist in the checkout: each case trips exactly one check."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", script], cwd=REPO, env={**base, "EXP_DIR": str(tmp_path), **env},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and message in res.stderr, (res.returncode, res.stderr)


def test_finetune_sbatch_rejects_an_unknown_task():
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", "slurm/finetune.sbatch"], cwd=REPO, env={**base, "TASK": "pos"},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "TASK must be ner, re, qa or classify, got 'pos'" in res.stderr, res.stderr


# A stand-in srun that writes its arguments (one per line, NUL-free) and the step's exit status 0, and an scontrol
# that names the job's one host: the batch shell's own logic runs as on a cluster, up to the step it launches.
FAKE_SRUN = '#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done >> "$SRUN_CALLS"\nprintf "\\n" >> "$SRUN_CALLS"\n'
FAKE_SCONTROL = '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo node1\n'


def _srun_calls(calls: Path) -> list[list[str]]:
    return [c.split("\0") for c in calls.read_text().split("\0\n") if c] if calls.exists() else []


@pytest.mark.parametrize("task", ["ner", "re", "qa", "classify"])
def test_finetune_sbatch_accepts_every_finetune_task(task, tmp_path):
    """Every ``bio-megatron finetune`` task launches (TASK=classify was refused): inside a job (SLURM_* set, a
    stand-in srun) the step runs ``bio-megatron finetune <task> --config <recipe> <arguments>`` on every rank, and
    the ``launching:`` line the job log shows copy-pastes: bash reads it back into the very same srun arguments
    (it was ``${SRUN_CMD[*]}``: the per-rank ``bash -c`` script, an argument with a space and a ``[0]`` override
    came back as other words)."""
    import argparse

    from bio_megatron.cli import build_parser

    def commands(parser: argparse.ArgumentParser) -> dict:
        return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    assert task in commands(commands(build_parser())["finetune"])  # the tasks the CLI has
    fake, calls = tmp_path / "bin", tmp_path / "srun.calls"
    fake.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    (tmp_path / "[0]").mkdir()  # a glob that matches: an unquoted trainer.devices=[0] would not stay itself
    recipe = f"nemo_configs/{task}/tiny_{task}.yaml"
    args = [f"model.dataset.data_dir={tmp_path}/my data", "trainer.devices=[0]", "--dry-run"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**base, "TASK": task, "RECIPE": recipe, "EXP_DIR": str(tmp_path / "runs"), "RUN_NAME": "ft", "VENV": "",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2",
           "GPUS_PER_NODE": "2", "SRUN_CALLS": str(calls),
           "PATH": f"{fake}:{REPO / '.venv' / 'bin'}:{base['PATH']}"}
    res = subprocess.run(["bash", "slurm/finetune.sbatch", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and "TASK must be" not in res.stderr, (res.stdout, res.stderr)
    (launched,) = _srun_calls(calls)
    rank_command = launched[launched.index("bash") + 4:]  # after bash -c SCRIPT $0
    assert rank_command == ["bio-megatron", "finetune", task, "--config", recipe, *args,
                            f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.name=ft"], launched
    (line,) = [ln for ln in res.stdout.splitlines() if "] launching: " in ln]
    printed = line.split("] launching: ", 1)[1]
    again = subprocess.run(["bash", "-c", printed], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert again.returncode == 0, again.stderr
    assert _srun_calls(calls)[1] == launched, printed
