"""Fine-tuning runs you can watch (issue 27, item 3): the run folder gets TensorBoard by default (NeMo's
``exp_manager.create_tensorboard_logger`` default), ``metrics.jsonl``, a log file and the resolved config with what
the run derived from it (``hparams.yaml``, as NeMo writes it); the step lines carry epoch, step, examples/s and ETA.

One real ``bio-megatron finetune ner`` process on the tiny recipe as it is (6 steps, dev every 3), shared by every
assertion here."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reliability.cli_log import run_cli

ROOT = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"epoch (\d+)/(\d+) \| step (\d+)/(\d+) \| loss [\d.]+ \| lr \S+ \| grad norm \S+ \| "
                       r"([\d,.]+) examples/s \| ETA (\d+:\d\d:\d\d)")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    """(the seed's run folder, the process's stderr) of one fine-tuning run through the CLI."""
    exp = tmp_path_factory.mktemp("watch")
    proc = subprocess.run([sys.executable, "-m", "bio_megatron", "finetune", "ner", "--config", "tiny_ner",
                           "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=2",
                           "model.dataset.max_eval_examples=24", "model.optim.lr=1e-3", f"exp_manager.exp_dir={exp}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exp / "tiny_ner" / "seed42", proc.stderr  # the recipe's trainer.seed


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_jsonl_has_each_logged_step_and_each_dev_evaluation(run):
    run_dir, _ = run
    recs = _records(run_dir)
    train = [r for r in recs if "loss" in r]
    dev = [r for r in recs if "dev_f1" in r]
    assert [r["step"] for r in train] == [1, 2, 4, 6]  # step 1, every 2nd, the last
    assert [r["step"] for r in dev] == [3, 6]
    history = {h["step"]: h["loss"] for h in json.loads((run_dir / "results.json").read_text())["history"]
               if "loss" in h}
    for r in train:
        assert r["loss"] == pytest.approx(history[r["step"]], rel=1e-6)
        assert r["epoch"] == 0 and r["examples_per_sec"] > 0 and r["eta_s"] >= 0 and math.isfinite(r["grad_norm"])
    assert train[-1]["eta_s"] == 0.0 and train[0]["eta_s"] > 0
    for r in dev:
        assert 0.0 <= r["dev_f1"] <= 1.0 and r["val_loss"] > 0


def test_tensorboard_is_on_by_default_with_nemo_tags(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    (events,) = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reduced_train_loss", "lr", "grad_norm", "global_step", "consumed_samples", "val_loss", "val_f1",
            "examples_per_sec", "epoch"} <= tags, tags
    losses = {e.step: e.value for e in acc.Scalars("reduced_train_loss")}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]  # every step, as the loop logs them
    assert [e.step for e in acc.Scalars("val_f1")] == [3, 6]


def test_log_file_holds_the_step_lines_with_epoch_throughput_and_eta(run):
    run_dir, stderr = run
    text = (run_dir / "run.log").read_text()
    steps = [m.groups() for m in STEP_LINE.finditer(text)]
    assert [int(s[2]) for s in steps] == [1, 2, 4, 6] and all(s[3] == "6" for s in steps)
    assert all((s[0], s[1]) == ("1", "1") for s in steps)  # 6 steps of a 37-step epoch: epoch 1 of 1
    assert [m.groups() for m in STEP_LINE.finditer(stderr)] == steps  # the same lines as the terminal's
    assert "step 3: dev f1" in text and "scoring the checkpoint of step" in text


def test_hparams_yaml_is_the_resolved_config_and_what_the_run_derived(run):
    run_dir, _ = run
    h = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert h["cfg"]["optim"]["lr"] == 1e-3 and h["cfg"]["size"] == "tiny"  # the model block, as NeMo's cfg
    assert h["cfg"]["dataset"]["max_eval_examples"] == 24
    assert (h["trainer"]["max_steps"], h["trainer"]["seed"], h["exp_manager"]["create_tensorboard_logger"]) == \
        (6, 42, True)
    d = h["derived"]
    assert (d["max_steps"], d["steps_per_epoch"], d["train_examples"], d["dev_examples"]) == (6, 600 // 16, 600, 24)
    assert d["labels"] == ["O", "B-Chemical", "I-Chemical"] and d["world_size"] == 1


def test_report_draws_throughput_and_grad_norm_of_a_finetuning_run(run, tmp_path):
    run_dir, _ = run
    rc, msg = run_cli(["report", str(run_dir), "--out", str(tmp_path / "report")])
    assert rc == 0, msg
    names = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"loss.png", "grad_norm.png", "throughput.png", "dev_f1.png", "index.html"} <= names, names
