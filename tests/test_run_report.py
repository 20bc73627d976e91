"""``bio-megatron report RUN_DIR`` on real run folders: a tiny pretraining run (metrics.jsonl) and a tiny
fine-tuning run (its results.json history). The PNGs are read back as images by matplotlib, the HTML page
references each of them, its numbers are the run's; missing or empty metrics are one line and exit 2 with
nothing written; --out follows the folder-output rules (a user's folder is never replaced)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from harness import run_world
from matplotlib.image import imread

from engine.pretrain_runs import overrides, pretrain_rank
from reliability.cli_log import run_cli


def _pngs_of(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return re.findall(r'<img src="([^"]+)"', text)


def _check_images(out: Path) -> list[str]:
    names = _pngs_of(out / "index.html")
    assert names and sorted(names) == sorted(p.name for p in out.glob("*.png"))  # every PNG shown, none dangling
    for name in names:
        img = imread(out / name)  # a real PNG (matplotlib's own reader)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    return names


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory, pubmed_prefix) -> Path:
    root = tmp_path_factory.mktemp("pre")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "run", steps=4, extra=("trainer.val_check_interval=2",)))
    return root / "run"


def test_report_of_a_pretraining_run(pretrain_run, tmp_path):
    out = tmp_path / "rep"
    rc, err = run_cli(["report", str(pretrain_run), "--out", str(out)])
    assert rc == 0, err
    names = _check_images(out)
    assert {"loss.png", "lr.png", "grad_norm.png", "throughput.png"} <= set(names)
    recs = [json.loads(ln) for ln in (pretrain_run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in recs if "loss" in r][-1]
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    page = (out / "index.html").read_text()
    assert f"{last['loss']:.4f} at step {last['step']}" in page and f"last {vals[-1]:.4f}" in page
    assert "http" not in page.replace('lang="en"', "")  # nothing fetched from the network
    # an earlier report is replaced only with --overwrite; a folder of the user's never
    before = (out / "loss.png").read_bytes()
    rc, err = run_cli(["report", str(pretrain_run), "--out", str(out)])
    assert rc == 2 and "--overwrite" in err and (out / "loss.png").read_bytes() == before
    assert run_cli(["report", str(pretrain_run), "--out", str(out), "--overwrite"])[0] == 0
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("x")
    rc, err = run_cli(["report", str(pretrain_run), "--out", str(mine), "--overwrite"])
    assert rc == 2 and "refusing to replace it" in err and sorted(p.name for p in mine.iterdir()) == ["chapter1.tex"]


def test_report_of_a_finetuning_run(tmp_path):
    from finetune.ft_runs import finetune_rank

    over = ["trainer.max_steps=3", "trainer.val_check_interval=1", "model.dataset.max_train_examples=16",
            "model.dataset.max_eval_examples=8", "model.dataset.test_file=null", "model.micro_batch_size=4",
            "model.global_batch_size=8", "exp_manager.create_tensorboard_logger=false",
            f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ner"]
    res = run_world(1, finetune_rank, "ner", over)[0]
    rc, err = run_cli(["report", str(tmp_path / "ner")])  # default --out: RUN_DIR/report
    assert rc == 0, err
    out = tmp_path / "ner" / "report"
    names = _check_images(out)
    assert {"loss.png", "lr.png", "dev_f1.png"} <= set(names)
    page = (out / "index.html").read_text()
    dev = [h["dev_f1"] for h in res["history"] if "dev_f1" in h]
    assert len(dev) == 3 and f"best {max(dev):.4f}" in page


def test_report_refuses_a_folder_without_metrics(tmp_path):
    empty = tmp_path / "run"
    empty.mkdir()
    rc, err = run_cli(["report", str(empty), "--out", str(tmp_path / "a")])
    assert rc == 2 and "no metrics.jsonl, results.json or resume/state.json" in err and str(empty) in err
    (empty / "metrics.jsonl").write_text("\n")
    rc, err = run_cli(["report", str(empty), "--out", str(tmp_path / "a")])
    assert rc == 2 and "no training or evaluation records" in err and "metrics.jsonl" in err
    (empty / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    rc, err = run_cli(["report", str(empty), "--out", str(tmp_path / "a")])
    assert rc == 2 and "broken JSON" in err and ":2" in err
    assert "\n" not in err and not (tmp_path / "a").exists() and not list(tmp_path.glob(".a.*"))
