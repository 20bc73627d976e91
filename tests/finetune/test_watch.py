"""Fine-tuning runs you can watch (issue 27, item 3): the run folder gets TensorBoard by default (NeMo's
``exp_manager.create_tensorboard_logger`` default), ``metrics.jsonl``, a log file and the resolved config with what
the run derived from it (``hparams.yaml``, as NeMo writes it); the step lines carry epoch, step, examples/s and ETA.

NeMo's ``exp_manager.create_wandb_logger`` / ``create_mlflow_logger`` with the real ``wandb`` (offline mode) and
``mlflow`` (its local file store) packages, where they are installed (the ``test`` extra installs them).

One real ``bio-megatron finetune ner`` process on the tiny recipe as it is (6 steps, dev every 3), shared by every
assertion here."""

from __future__ import annotations

import importlib.util
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
TRACKERS = all(importlib.util.find_spec(p) for p in ("wandb", "mlflow"))
STEP_LINE = re.compile(r"epoch (\d+)/(\d+) \| step (\d+)/(\d+) \| loss [\d.]+ \| lr \S+ \| grad norm \S+ \| "
                       r"([\d,.]+) examples/s \| ETA (\d+:\d\d:\d\d)")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    """(the seed's run folder, the process's stderr) of one fine-tuning run through the CLI."""
    exp = tmp_path_factory.mktemp("watch")
    trackers = ["exp_manager.create_wandb_logger=true", "+exp_manager.wandb_logger_kwargs={project: bm, name: null}",
                "exp_manager.create_mlflow_logger=true"] if TRACKERS else []
    proc = subprocess.run([sys.executable, "-m", "bio_megatron", "finetune", "ner", "--config", "tiny_ner",
                           "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=2",
                           "model.dataset.max_eval_examples=24", "model.optim.lr=1e-3", f"exp_manager.exp_dir={exp}",
                           *trackers], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                               "WANDB_MODE": "offline"})  # no network
    assert proc.returncode == 0, proc.stderr[-3000:]
    json.loads(proc.stdout)  # the trackers leave stdout to the summary
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


def wandb_run(run_dir: Path) -> tuple[dict, dict, list[dict]]:
    """(run record fields, config, history rows without W&B's own ``_`` keys) of the one offline W&B run under
    ``run_dir/wandb``, read from its ``run-<id>.wandb`` file: W&B's record log (a 7-byte header, then LevelDB-style
    blocks of 32 KiB: chunks of crc32, length, type 1 full / 2 first / 3 middle / 4 last) of protobuf ``Record``s,
    parsed with wandb's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, chunks, buf = 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        n, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            chunks.append(buf + chunk if kind == 4 else chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
    run, config, history = {}, {}, []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = {"name": r.run.display_name, "project": r.run.project}
            config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_")} | {"step": r.history.step.num})
    return run, config, history


@pytest.mark.skipif(not TRACKERS, reason="wandb and mlflow are not installed (pip install '.[wandb,mlflow]')")
def test_wandb_offline_run_has_the_config_and_every_record(run):
    run_dir, _ = run
    info, config, history = wandb_run(run_dir)
    assert info == {"name": "tiny_ner/seed42", "project": "bm"}  # name: null in the kwargs = the run's name
    assert config["model"]["optim"]["lr"] == 1e-3 and config["derived"]["max_steps"] == 6
    by_step: dict[int, dict] = {}
    for rec in _records(run_dir):  # what metrics.jsonl has, W&B has, step for step (a step's records merged)
        by_step.setdefault(rec["step"], {}).update({k: v for k, v in rec.items() if v is not None})
    got = {h["step"]: h for h in history}
    assert sorted(got) == sorted(by_step) == [1, 2, 3, 4, 6]
    for step, want in by_step.items():
        assert got[step] == pytest.approx(want), step


@pytest.mark.skipif(not TRACKERS, reason="wandb and mlflow are not installed (pip install '.[wandb,mlflow]')")
def test_mlflow_file_store_run_has_the_params_and_metrics(run, monkeypatch):
    from mlflow.tracking import MlflowClient

    run_dir, _ = run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file:{run_dir / 'mlruns'}")
    exp = client.get_experiment_by_name("tiny_ner")  # the recipe's name, as NeMo names the experiment
    (found,) = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "tiny_ner/seed42" and found.info.status == "FINISHED"
    assert found.data.params["model.optim.lr"] == "0.001" and found.data.params["derived.train_examples"] == "600"
    recs = _records(run_dir)
    for key in ("loss", "examples_per_sec", "dev_f1", "val_loss"):
        want = {r["step"]: r[key] for r in recs if r.get(key) is not None}
        got = {m.step: m.value for m in client.get_metric_history(found.info.run_id, key)}
        assert got == pytest.approx(want) and len(want) >= 2, key
