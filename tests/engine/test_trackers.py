"""Pretraining with NeMo's ``exp_manager.create_wandb_logger`` and ``create_mlflow_logger`` (issue 27, item 3): the
real ``wandb`` (offline mode) and ``mlflow`` (local file store) packages get the resolved config and every record of
``metrics.jsonl``, step for step; bad logger keys stop the run in one line. (Fine-tuning: tests/finetune/test_watch.py.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bio_megatron.config.pretrain import load_pretrain_config
from bio_megatron.training.trackers import open_trackers
from bio_megatron.utils.errors import ConfigError
from engine.pretrain_runs import TINY, overrides
from finetune.test_watch import wandb_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(p) for p in ("wandb", "mlflow")),
                                reason="wandb and mlflow are not installed (pip install '.[wandb,mlflow]')")


def test_pretraining_logs_to_wandb_offline_and_mlflow_file_store(pubmed_prefix, tmp_path, monkeypatch):
    over = overrides(pubmed_prefix, tmp_path, "trk", steps=3, extra=(
        "trainer.val_check_interval=2", "exp_manager.create_wandb_logger=true",
        "exp_manager.create_mlflow_logger=true",
        "+exp_manager.mlflow_logger_kwargs={experiment_name: bm, tags: {a: b}}"))
    proc = subprocess.run([sys.executable, "-m", "bio_megatron", "pretrain", "--config", str(TINY), *over], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                               "WANDB_MODE": "offline"})  # no network
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "trk"
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3]
    assert [r["step"] for r in recs if "val_loss" in r] == [2, 3]  # every 2 steps and at the end

    # the run folder also holds its log lines and its resolved config (as fine-tuning's, NeMo's hparams.yaml)
    assert all(f"step {s}/3 | loss" in (run_dir / "run.log").read_text() for s in (1, 2, 3))
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert hparams["cfg"]["size"] == "tiny" and hparams["derived"]["max_steps"] == 3

    info, config, history = wandb_run(run_dir)
    assert info["name"] == "trk" and config["trainer"]["max_steps"] == 3
    rows = {h["step"]: h for h in history}
    for r in recs:
        for key in ("loss", "tokens_per_sec", "val_loss"):
            if r.get(key) is not None:
                assert rows[r["step"]][key] == pytest.approx(r[key]), (r["step"], key)

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to read a file store
    client = MlflowClient(f"file:{run_dir / 'mlruns'}")
    (found,) = client.search_runs([client.get_experiment_by_name("bm").experiment_id])
    assert found.info.status == "FINISHED" and found.data.tags["a"] == "b"
    assert found.data.params["model.size"] == "tiny" and found.data.params["trainer.max_steps"] == "3"
    losses = {m.step: m.value for m in client.get_metric_history(found.info.run_id, "loss")}
    assert losses == pytest.approx({r["step"]: r["loss"] for r in recs if "loss" in r})


def test_unknown_logger_keys_are_refused_on_every_rank(tmp_path):
    """Checked before anything is opened, on ranks that open nothing too, so all ranks stop alike (exit 2)."""
    cfg = load_pretrain_config(TINY, ["exp_manager.create_mlflow_logger=true",
                                      "+exp_manager.mlflow_logger_kwargs={experiment_nme: x}",
                                      "exp_manager.create_wandb_logger=true",
                                      "+exp_manager.wandb_logger_kwargs={projekt: y}"])
    with pytest.raises(ConfigError) as err:
        open_trackers(cfg, tmp_path, False, {})
    assert err.value.problems == [
        "exp_manager.mlflow_logger_kwargs: unknown key(s) experiment_nme; expected artifact_location, experiment_name, "
        "prefix, run_id, run_name, save_dir, tags, tracking_uri",
        "exp_manager.wandb_logger_kwargs: unknown key(s) projekt; expected wandb.init's arguments or Lightning "
        "WandbLogger's (save_dir, version, offline, prefix)"]
    assert list(tmp_path.iterdir()) == []


def test_dry_run_checks_the_logger_keys_too(pubmed_prefix, tmp_path, capsys):
    from reliability.cli_log import run_cli

    rc, msg = run_cli(["pretrain", "--config", str(TINY), f"model.data.data_prefix=[1.0,{pubmed_prefix}]",
                       f"exp_manager.exp_dir={tmp_path}", "exp_manager.create_mlflow_logger=true",
                       "+exp_manager.mlflow_logger_kwargs={tracking: x}", "--dry-run"])
    assert rc == 2 and "exp_manager.mlflow_logger_kwargs: unknown key(s) tracking" in msg, msg
    assert capsys.readouterr().out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("package, key", [("wandb", "create_wandb_logger"), ("mlflow", "create_mlflow_logger")])
def test_a_logger_whose_package_is_missing_is_one_line_naming_the_extra(package, key, pubmed_prefix, tmp_path,
                                                                       capsys, monkeypatch):
    """The trackers are optional extras: where the package is not installed (importlib finds no such module, as
    ``sys.modules[name] = None`` makes it), the dry run stops in one line naming the extra, exit 2, nothing written."""
    from reliability.cli_log import run_cli

    monkeypatch.setitem(sys.modules, package, None)
    assert importlib.util.find_spec(package) is None
    rc, msg = run_cli(["pretrain", "--config", str(TINY), f"model.data.data_prefix=[1.0,{pubmed_prefix}]",
                       f"exp_manager.exp_dir={tmp_path}", f"exp_manager.{key}=true", "--dry-run"])
    assert rc == 2 and f"exp_manager.{key} is true but the {package} package is not installed: " \
        f"pip install 'bio-megatron[{package}]'" in msg, msg
    assert capsys.readouterr().out == "" and list(tmp_path.iterdir()) == []
