"""The image for real: the Dockerfile built with podman and run.

nvcr.io cannot be reached here, so the build's ``BASE_IMAGE`` is a local stand-in for the NGC
PyTorch image (tests/launch/container_base.sh: Debian, this venv's Python 3.12, torch and
megatron-core), and the build runs with ``--network=none`` and ``PIP_EXTRA_ARGS=--no-index
--no-build-isolation`` (the air-gapped mode of the Dockerfile). Everything else is the real thing:
the Dockerfile's own steps, entrypoint and CMD, and the tiny TP2 x DP2 run inside the container,
which must reproduce the single-host torchrun run (conftest.reference_run) loss for loss. The
fixtures that build the image are in conftest.py.
"""

from __future__ import annotations

import json

import pytest

from launch_cmds import IMAGE_HELP_COMMAND, IMAGE_RUN_COMMAND, read_metrics, run_command
from test_launch_slurm import assert_same_losses

pytestmark = pytest.mark.slurm  # the reference run comes from the SLURM fixtures (root, netns)


def test_image_default_command_is_the_cli_help(image, podman_env):
    out = run_command(IMAGE_HELP_COMMAND, podman_env, timeout=120).stdout
    assert out.startswith("usage: bio-megatron"), out
    for command in ("pretrain", "finetune", "evaluate", "predict", "export", "data", "vocab", "bench"):
        assert f"    {command} " in out, (command, out)
    # The entrypoint maps a bare sub-command to the CLI (`docker run IMAGE pretrain ...`).
    out = run_command(f"{IMAGE_HELP_COMMAND} pretrain --help", podman_env, timeout=120).stdout
    assert out.startswith("usage: bio-megatron pretrain"), out


def test_image_runs_the_tiny_tp2_dp2_job_like_the_host(image, podman_env, tiny_corpus, runs_dir, reference_run):
    env = {**podman_env, "DATA": str(tiny_corpus), "RUNS": str(runs_dir)}
    run_command(IMAGE_RUN_COMMAND, env, timeout=600)
    run = runs_dir / "container"
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert (run / "checkpoints" / "iter_0000020" / "bio_megatron.json").exists()
    assert_same_losses(run, reference_run)
    assert read_metrics(run)[20] == read_metrics(reference_run)[20]
