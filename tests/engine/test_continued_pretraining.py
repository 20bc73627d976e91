"""Continued pretraining: a new run starts at step 0 from another run's checkpoint, model weights only
(fresh optimizer and schedule), at any layout; and the demo's real torchrun path works end to end."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from harness import run_world

from engine.pretrain_runs import losses, overrides, pretrain_rank


def test_restore_model_weights_only_at_another_layout(pubmed_prefix, tmp_path):
    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "general", steps=6, save_last=True))
    src = tmp_path / "general" / "checkpoints" / "iter_0000006"
    scratch = losses(tmp_path / "general")
    for name, tp in (("cont_tp1", 1), ("cont_tp2", 2)):
        run_world(tp, pretrain_rank, overrides(pubmed_prefix, tmp_path, name, tp=tp, steps=2,
                                               extra=(f"model.restore_from_path={src}",)))
    tp1, tp2 = losses(tmp_path / "cont_tp1"), losses(tmp_path / "cont_tp2")
    assert sorted(tp1) == [1, 2]  # a new run: its own step count
    # Same data batch 0 as the scratch run's step 1, but trained weights: a clearly lower loss.
    assert tp1[1] < scratch[1] - 0.05
    assert tp2[1] == pytest.approx(tp1[1], abs=1e-5) and tp2[2] == pytest.approx(tp1[2], abs=1e-5)


@pytest.mark.slow
def test_demo_runs_under_torchrun(tmp_path):
    """The demo's real torchrun path; it states its unigram baselines and compares its final validation loss with
    the held-out one in its summary; the launch line it logs pastes into a shell (its folder has a space)."""
    out = tmp_path / "my demo"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "bio_megatron", "demo", "--out", str(out), "--steps", "30"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "MLM loss" in p.stdout and "checkpoint    30" in p.stdout
    assert "unigram baselines: " in p.stderr and re.search(r"learned +final val loss [0-9.]+ (<|>=) unigram "
                                                           r"baseline [0-9.]+ \((below|not below)", p.stdout), p.stdout
    (launch,) = [ln.split("launching: ", 1)[1] for ln in p.stderr.splitlines() if "launching: " in ln]
    words = shlex.split(launch)
    assert words[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"], words
    assert f"exp_manager.exp_dir={out}" in words, words
    recs = [json.loads(x) for x in (out / "tiny_tp2" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_sec"} <= set(steps[0])
    assert steps[-1]["loss"] < steps[0]["loss"]
    meta = json.loads((out / "tiny_tp2" / "checkpoints" / "iter_0000030" / "bio_megatron.json").read_text())
    assert meta["layout"]["tp"] == 2
    assert (out / "tiny_tp2" / "checkpoints" / "iter_0000030" / "vocab.txt").exists()
    assert list((out / "tiny_tp2" / "tensorboard").glob("events.out.tfevents.*"))


def test_blended_prefixes_train(pubmed_prefix, tmp_path):
    """NeMo's ``data_prefix: [weight, path, weight, path]`` goes through megatron-core's BlendedDataset."""
    blend = f"model.data.data_prefix=[0.3,{pubmed_prefix},0.7,{pubmed_prefix}]"
    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "blend", steps=2, extra=(blend,)))
    assert sorted(losses(tmp_path / "blend")) == [1, 2]
    assert list((tmp_path / "index_cache").glob("*-BlendedDataset-train-dataset_index.npy"))
