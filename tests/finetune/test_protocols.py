"""The papers' fine-tuning protocols (issue 23 item 3): layer-wise learning-rate decay (ELECTRA / BioELECTRA) at
TP1, TP2 and PP2 read back from megatron-core's param groups; ``--grid key=v1,v2`` over any config key with
selection on dev; early stopping with patience; k-fold cross-validation (tuned on fold 1, median over 2-10)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
from pathlib import Path

import pytest
import yaml
from ft_runs import RECIPES, ROOT
from harness import Ran, cli_forked, run_world

DECAY, LR, LAYERS = 0.8, 1e-3, 4  # the tiny size has 4 layers


def _cli(argv: list[str]) -> Ran:
    """``bio-megatron argv`` run from the repository root (recipes by name), a process of its own forked from this
    one; the test process's working directory is restored."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return cli_forked(argv, env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}, timeout=300)
    finally:
        os.chdir(cwd)


def _layer_lrs(tp: int, pp: int) -> dict:
    """One rank: the fine-tuning model at this layout, megatron's optimizer with layer-wise decay, one optimizer
    step and three scheduler steps (warm-up 2 of 10 steps, then linear decay); each parameter's lr by name."""
    from bio_megatron.config.finetune import load_finetune_config
    from megatron.core import parallel_state as ps

    from bio_megatron.tasks.finetune import setup
    from bio_megatron.training.optimizer import build_optimizer, build_scheduler

    os.chdir(ROOT)
    cfg = load_finetune_config("ner", RECIPES["ner"], [
        f"model.tensor_model_parallel_size={tp}", f"model.pipeline_model_parallel_size={pp}",
        f"model.optim.layerwise_lr_decay={DECAY}", f"model.optim.lr={LR}", "model.optim.sched.name=linear",
        "model.optim.sched.warmup_steps=2", "model.optim.sched.warmup_ratio=null",
        "model.optim.sched.min_lr=0.0", "model.dataset.max_train_examples=16",
        "model.dataset.max_eval_examples=8"], int(os.environ["WORLD_SIZE"]))
    _world, _tok, _task, model, ddp, dtype, _padded = setup(cfg)
    m = cfg.model
    optimizer = build_optimizer(m.optim, [ddp], dtype, 1.0, False, m)
    scheduler = build_scheduler(optimizer, m.optim, 10)
    ddp.zero_grad_buffer()
    optimizer.step()
    scheduler.step(1)
    lrs_at_1 = _by_name(model, optimizer)
    scheduler.step(2)  # step 3: past the warm-up, into the linear decay
    return {"stage": ps.get_pipeline_model_parallel_rank(), "at_1": lrs_at_1, "at_3": _by_name(model, optimizer),
            "logged": optimizer.param_groups[0]["lr"]}


def _by_name(model, optimizer) -> dict[str, float]:
    lr_of = {id(p): float(g["lr"]) for g in optimizer.param_groups for p in g["params"]}
    return {name: lr_of[id(p)] for name, p in model.named_parameters()}


def _expected_multiplier(name: str, stage: int, pp: int) -> float:
    """Written from ELECTRA's convention, by name: embeddings depth 0, layer l (global, 0-based) depth l + 1, the
    rest (head, final LayerNorm) depth L + 2; lr x decay ** (L + 2 - depth)."""
    local = re.search(r"\.layers\.(\d+)\.", name)
    if local:
        depth = int(local.group(1)) + stage * (LAYERS // pp) + 1
    elif name.startswith("embedding."):
        depth = 0
    else:
        depth = LAYERS + 2
    return DECAY ** (LAYERS + 2 - depth)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "pp2"])
def test_layerwise_lr_decay_gives_each_parameter_its_depths_rate(tp, pp):
    ranks = run_world(tp * pp, _layer_lrs, tp, pp)
    seen_layers, seen = set(), set()
    for r in ranks:
        for name, lr in r["at_1"].items():
            mult = _expected_multiplier(name, r["stage"], pp)
            # step 1 of a 2-step warm-up from 0: half the peak; step 3: 7/8 of it (linear decay over steps 2..10)
            assert lr == pytest.approx(LR * mult * 0.5, rel=1e-12), name
            assert r["at_3"][name] == pytest.approx(LR * mult * 7 / 8, rel=1e-12), name
            seen.add(round(mult, 12))
            if m := re.search(r"\.layers\.(\d+)\.", name):
                seen_layers.add(int(m.group(1)) + r["stage"] * (LAYERS // pp))
        assert r["logged"] == pytest.approx(LR * 7 / 8, rel=1e-12)  # the step line's lr: the head's, undecayed
    # every depth occurred: embeddings, the four global layers, the head
    assert seen_layers == set(range(LAYERS))
    assert len(seen) == LAYERS + 2


# --- one tiny end-to-end CLI run: a grid over the learning rate, each point with early stopping --------------------

GRID_LRS = ("1e-09", "0.003")  # the first cannot move the dev loss by min_delta: it must stop at patience


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory) -> tuple[Path, dict]:
    """(the sweep folder, its printed summary) of ``finetune ner --grid model.optim.lr=... --seeds 1`` with early
    stopping on val_loss, patience 1, dev every 2 steps, at most 8 steps."""
    exp = tmp_path_factory.mktemp("protocols")
    proc = _cli(["finetune", "ner", "--config", "tiny_ner",
                 "trainer.max_steps=8", "trainer.val_check_interval=2", "model.dataset.max_train_examples=32",
                 "model.dataset.max_eval_examples=16", f"exp_manager.exp_dir={exp}",
                 "exp_manager.create_early_stopping_callback=true",
                 "exp_manager.early_stopping_callback_params.patience=1",
                 "--grid", f"model.optim.lr={','.join(GRID_LRS)}", "--seeds", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exp / "tiny_ner", json.loads(proc.stdout)


def _expected_stop(val_losses: list[tuple[int, float]], patience: int = 1, min_delta: float = 0.001) -> int | None:
    """Lightning's EarlyStopping (mode min), written from its documentation: the step it stops at, or None."""
    best, wait = math.inf, 0
    for step, loss in val_losses:
        if loss < best - min_delta:
            best, wait = loss, 0
        else:
            wait += 1
            if wait >= patience:
                return step
    return None


def test_grid_selects_on_dev_and_early_stopping_stops_at_patience(grid_run):
    sweep, summary = grid_run
    assert summary["grid_keys"] == ["model.optim.lr"]
    rows = {row["model.optim.lr"]: row["dev_f1"] for row in summary["grid"]}
    assert set(rows) == set(GRID_LRS)
    assert summary["selected"]["dev_f1"] == max(rows.values())
    assert summary["selected"] == next(r for r in summary["grid"] if r["dev_f1"] == max(rows.values()))
    stops = {}
    for lr in GRID_LRS:
        run_dir = sweep / f"model.optim.lr={lr}" / "seed1"
        res = json.loads((run_dir / "results.json").read_text())
        dev = [(h["step"], h["val_loss"]) for h in res["history"] if "val_loss" in h]
        last = max(h["step"] for h in res["history"] if "loss" in h)
        want = _expected_stop(dev)
        assert res["stopped_early_at"] == want and last == (want or 8), (lr, dev)
        # the checkpoint kept is the best by dev F1 among the evaluations that ran
        f1 = {h["step"]: h["dev_f1"] for h in res["history"] if "dev_f1" in h}
        assert f1[res["best_step"]] == max(f1.values()) and Path(res["checkpoint"]).is_dir()
        stops[lr] = want
    assert stops["1e-09"] == 4  # evaluations at 2 (the first best) and 4 (no change): patience 1 reached
    md = (sweep / "results.md").read_text()
    assert "| model.optim.lr | dev_f1 (mean over seeds) | selected |" in md and md.count("✓") == 1


def test_grid_points_take_any_key_the_papers_sweep():
    """The keys BioELECTRA's and BioM-Transformers' grids sweep (learning rate, batch size, epochs), the layer-wise
    decay and the head's shape: the cartesian product, each point a validated config holding its values."""
    from bio_megatron.tasks.grid import grid_points

    grid = {"model.optim.lr": ("1e-5", "2e-5"), "model.global_batch_size": ("16", "32"), "trainer.max_epochs": ("5",),
            "model.optim.layerwise_lr_decay": ("0.8",), "model.head.num_fc_layers": ("2",)}  # each not the recipe's
    points = grid_points("ner", RECIPES["ner"], ["model.optim.lr=1e-3"], [f"{k}={','.join(v)}" for k, v in grid.items()],
                         1)
    assert [tuple(p.values.values()) for p in points] == list(itertools.product(*grid.values()))
    for p in points:
        c = p.cfg
        got = (c.model.optim.lr, c.model.global_batch_size, c.trainer.max_epochs, c.model.optim.layerwise_lr_decay,
               c.model.head.num_fc_layers)
        assert got == tuple(t(v) for t, v in zip((float, int, int, float, int), p.values.values())), p.tag
    assert len({p.tag for p in points}) == 4  # one run folder per point


@pytest.mark.parametrize("argv,message", [
    (["--grid", "model.optim.nope=1,2"], "--grid model.optim.nope=1,2: unknown key 'model.optim.nope'"),
    (["--grid", "model.optim.lr=abc"], "--grid model.optim.lr=abc:"),
    (["--grid", "model.optim.lr"], "--grid 'model.optim.lr': expected key=v1,v2"),
    (["exp_manager.early_stopping_callback_params.patience=0"],
     "exp_manager.early_stopping_callback_params.patience (0) must be >= 1"),
], ids=["unknown-key", "bad-value", "no-values", "patience-0"])
def test_bad_grid_or_patience_is_one_line_and_writes_nothing(tmp_path, argv, message):
    from reliability.cli_log import run_cli

    os.chdir(ROOT)
    rc, msg = run_cli(["finetune", "ner", "--config", "tiny_ner", f"exp_manager.exp_dir={tmp_path}", *argv])
    assert rc == 2 and message in msg, msg
    # ConfigError's form: the header, then one problem on one line
    assert msg.startswith("invalid configuration") and msg.count("\n") == 1, msg
    assert list(tmp_path.iterdir()) == []


# --- k-fold cross-validation: tuned on fold 1, the median over the other folds --------------------------------------

def _write_folds(root: Path) -> Path:
    """Three BioBERT-style GAD folds from the GAD fixture, each holding different test rows (different scores)."""
    rows = (ROOT / "tests" / "fixtures" / "blurb" / "GAD" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    for fold, test in ((1, rows), (2, rows[:4]), (3, rows[2:])):
        d = root / str(fold)
        d.mkdir(parents=True)
        (d / "train.tsv").write_text("".join(r.split("\t", 1)[1] + "\n" for r in rows), encoding="utf-8")
        (d / "test.tsv").write_text("index\tsentence\tlabel\n" + "".join(r + "\n" for r in test), encoding="utf-8")
    return root


def test_cross_validation_tunes_on_fold_1_and_reports_the_median_of_the_others(tmp_path):
    data, exp = _write_folds(tmp_path / "gad"), tmp_path / "runs"
    proc = _cli(["finetune", "classify", "--config", "tiny_classify",
                 f"model.dataset.data_dir={data}", "model.dataset.train_file=train.tsv",
                 "model.dataset.dev_file=test.tsv", "model.dataset.test_file=test.tsv",
                 "trainer.max_steps=2", "trainer.val_check_interval=2", f"exp_manager.exp_dir={exp}",
                 "--folds", "1-3", "--grid", "model.optim.lr=0.001,1e-09", "--seeds", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    out = exp / "tiny_classify"
    assert summary == json.loads((out / "results.json").read_text())
    tuned = json.loads((out / "fold1" / "results.json").read_text())
    assert [r["model.optim.lr"] for r in tuned["grid"]] == ["0.001", "1e-09"]  # the grid ran on fold 1 only
    lr = tuned["selected"]["model.optim.lr"]
    assert summary["tuned_on"] == 1 and summary["chosen_overrides"] == [f"model.optim.lr={lr}"]
    test = {}
    for fold in (2, 3):
        (run,) = (out / f"fold{fold}").glob("seed1")  # the chosen setting only, no grid folders
        res = json.loads((run / "results.json").read_text())
        test[fold] = res["test"]["score"]
        assert yaml.safe_load((run / "hparams.yaml").read_text())["cfg"]["optim"]["lr"] == float(lr)
    assert [r["fold"] for r in summary["folds"]] == [1, 2, 3]
    assert {r["fold"]: r["test"] for r in summary["folds"] if not r["tuning"]} == test
    assert summary["test"]["median"] == statistics.median(test.values()) and summary["test"]["n"] == 2
    md = (out / "results.md").read_text()
    assert "tuned on fold 1" in md and f"median {summary['test']['median']:.4g}" in md


def test_folds_without_a_fold_key_or_a_bad_range_are_one_line(tmp_path):
    from reliability.cli_log import run_cli

    os.chdir(ROOT)
    rc, msg = run_cli(["finetune", "ner", "--config", "tiny_ner", f"exp_manager.exp_dir={tmp_path}", "--folds", "1-3"])
    assert rc == 2 and "--folds: finetune ner has no model.dataset.fold" in msg, msg
    rc, msg = run_cli(["finetune", "classify", "--config", "tiny_classify", f"exp_manager.exp_dir={tmp_path}",
                       "--folds", "1"])
    assert rc == 2 and "--folds '1': at least two distinct folds" in msg, msg
    assert list(tmp_path.iterdir()) == []


# --- the papers' per-task fine-tuning values as recipes -------------------------------------------------------------

PROTOCOL_RECIPES = sorted(p for sub in ("bioelectra", "biom", "biolm") for p in ROOT.glob(f"nemo_configs/*/{sub}/*.yaml")
                          if p.stem != "_common")


@pytest.mark.parametrize("path", PROTOCOL_RECIPES, ids=lambda p: "/".join(p.parts[-3:]))
def test_paper_protocol_recipes_load_by_name_with_their_values(path):
    """Each recipe loads by its sub-folder name (not the top-level recipe of the same name) and carries its
    protocol: BioELECTRA's Table 6 decay 0.8; bio-lm's batch 16/32 and dev every 200/500 steps."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.config.recipes import find_recipe

    task, sub = path.parts[-3], path.parts[-2]
    found = find_recipe(task, f"{sub}/{path.stem}")
    assert found.resolve() == path.resolve()
    data = [f"model.dataset.{k}=x" for k in ("data_dir", "train_file", "dev_file", "test_file")] \
        if path.stem == "bioasq_yesno" else []  # registration-only data: the recipe leaves it to the user
    cfg = load_finetune_config(task, found, ["model.restore_from_path=ckpt", *data], 1)
    assert cfg.name == f"{sub}_{path.stem}"
    if sub == "bioelectra":
        assert cfg.model.optim.layerwise_lr_decay == 0.8 and cfg.model.optim.eps == 1e-6
    if sub == "biolm":
        assert (cfg.model.global_batch_size, cfg.trainer.val_check_interval) in ((32, 500), (16, 200))
        assert cfg.exp_manager.create_early_stopping_callback == (task != "ner")


def test_resuming_with_another_layerwise_decay_is_refused(tmp_path):
    """The restored param groups carry the checkpoint's per-layer rates: another decay is refused, not ignored."""
    from reliability.files import tree_digest
    from reliability.test_resume_checks import _finetune, _finetune_stopped_after

    over = ["trainer.max_steps=6", "trainer.val_check_interval=2", "model.dataset.max_eval_examples=16",
            "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=cut",
            "model.optim.layerwise_lr_decay=0.8"]
    assert run_world(1, _finetune_stopped_after, over, 2)[0]["status"] == "interrupted"
    before = tree_digest(tmp_path / "cut" / "resume")
    with pytest.raises(RuntimeError) as info:
        run_world(1, _finetune, over + ["model.optim.layerwise_lr_decay=0.5"])
    assert "model.optim.layerwise_lr_decay is 0.5" in str(info.value), str(info.value)[-2000:]
    assert tree_digest(tmp_path / "cut" / "resume") == before
