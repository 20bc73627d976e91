"""Mixed precision on CPU, the path a GPU run takes (``Float16Module``, megatron-core's mixed-precision
optimizer with fp32 main parameters, its ``DynamicGradScaler``), with the tiny recipe.

- bf16 at TP2xPP2 follows bf16 at TP1, and bf16 follows fp32 over 20 steps, within bounds derived below;
  metrics.jsonl records the compute dtype.
- The optimizer's main parameters are fp32, on the live objects and in the saved checkpoint.
- fp16: a huge initial loss scale overflows; those steps are skipped and the scale halves until training
  proceeds. A SIGTERM'd fp16 run resumes to the uninterrupted run's losses and loss scales exactly.
- bf16 checkpoints: exact resume at the same layout (plain and distributed optimizer), resharding TP2 -> PP2,
  fp32 <-> bf16 loads (weights only, with a warning); ``export hf --dtype`` fp32 (main parameters) and bf16.
- Fine-tuning (NER) in bf16 and fp16 follows fp32.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from harness import run_world, start_world

from engine.pretrain_runs import TINY, losses, overrides, pretrain_rank
from engine.test_resume import _wait_for

STEPS = 20


def _records(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _precision(p: str, *more: str) -> tuple[str, ...]:
    return (f"trainer.precision={p}", *more)


@pytest.fixture(scope="module")
def runs(pubmed_prefix, tmp_path_factory):
    """fp32 and bf16 TP1 runs of STEPS steps, each saving its final checkpoint."""
    root = tmp_path_factory.mktemp("precision")
    for name, p in (("fp32", "32"), ("bf16", "bf16")):
        run_world(1, pretrain_rank, overrides(pubmed_prefix, root, name, steps=STEPS, save_last=True,
                                              extra=_precision(p)))
    return root


def test_bf16_follows_fp32_and_records_its_dtype(runs):
    fp32, bf16 = losses(runs / "fp32"), losses(runs / "bf16")
    assert sorted(bf16) == sorted(fp32) == list(range(1, STEPS + 1))
    assert {r["compute_dtype"] for r in _records(runs / "bf16")} == {"bfloat16"}
    assert {r["compute_dtype"] for r in _records(runs / "fp32")} == {"float32"}
    # bf16 keeps 8 significant bits (unit roundoff 2^-9): were every rounding of the logits to push one way,
    # a loss of ~10 would move by 10 x 2^-9 = 0.02; roundings are independent over the ~40 masked tokens per
    # step (and the 64-wide dot products), so the expected drift is ~0.02 / sqrt(40) = 3e-3. Bound 5e-3;
    # measured max |diff| 5.4e-4 over the 20 steps (5.3e-5 at step 1, before any update), while the loss
    # falls by 0.29 (fp32 main parameters are asserted directly in the next tests).
    diffs = [abs(bf16[s] - fp32[s]) for s in fp32]
    assert max(diffs) < 5e-3, diffs
    assert diffs[0] < 1e-3, diffs  # before any update: only the forward's rounding
    assert fp32[STEPS] < fp32[1] - 0.1 and bf16[STEPS] < bf16[1] - 0.1  # both really trained


def test_bf16_tp2pp2_matches_tp1(pubmed_prefix, tmp_path):
    # fp32 is bit-identical across layouts (test_layout_invariance); bf16 is not: TP splits each matmul's
    # reduction, and the partial sums are rounded to bf16 before the all-reduce adds them, so the two runs
    # differ by the same kind of rounding as bf16 vs fp32 (expected ~3e-3, see above). Measured max |diff|
    # over 4 steps: 3.5e-4. Bound 2e-3: ~6x the measurement, and 35x below the 0.07 one update moves the loss
    # here, so a layout that lost or mis-sharded an update would fail.
    runs = {}
    for name, world, tp, pp in (("tp1", 1, 1, 1), ("tp2pp2", 4, 2, 2)):
        run_world(world, pretrain_rank, overrides(pubmed_prefix, tmp_path, name, tp=tp, pp=pp, steps=4,
                                                  extra=_precision("bf16-mixed")))
        runs[name] = losses(tmp_path / name)
    assert sorted(runs["tp1"]) == sorted(runs["tp2pp2"]) == [1, 2, 3, 4]
    for step, ref in runs["tp1"].items():
        assert runs["tp2pp2"][step] == pytest.approx(ref, abs=2e-3), (step, runs)


def _inspect_optimizer(over: list[str]) -> dict:
    """In a forked rank: the dtypes of the model, the optimizer's main parameters and its Adam state."""
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.data.pretrain import load_tokenizer
    from bio_megatron.models.bert import precision_dtype
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.optimizer import build_optimizer
    from bio_megatron.training.pretrain import build_stage

    init_distributed()
    cfg = load_pretrain_config(TINY, over, world_size=1)
    m = cfg.model
    init_model_parallel(1, 1, cfg.trainer.seed)
    dtype = precision_dtype(cfg.trainer.precision)
    model, ddp = build_stage(cfg, load_tokenizer(cfg).vocab_size, dtype)
    opt = build_optimizer(m.optim, [ddp], dtype, 1.0, False, m)
    inner = opt.chained_optimizers[0] if hasattr(opt, "chained_optimizers") else opt
    main = [p for g in inner.optimizer.param_groups for p in g["params"]]
    ddp.zero_grad_buffer()
    for p in model.parameters():  # a fake gradient, so that one step allocates the Adam state
        p.main_grad.fill_(1e-3)
    opt.step()
    state = [t for p in main for t in inner.optimizer.state[p].values() if torch.is_tensor(t) and t.numel() > 1]
    return {"model": {str(p.dtype) for p in model.parameters()}, "main": {str(p.dtype) for p in main},
            "state": {str(t.dtype) for t in state}, "grad_buffers": {str(b.grad_data.dtype) for b in ddp.buffers},
            "optimizer": type(inner).__name__}


def test_main_parameters_are_fp32_on_the_objects_and_in_the_checkpoint(runs, pubmed_prefix):
    (got,) = run_world(1, _inspect_optimizer, overrides(pubmed_prefix, runs, "inspect", extra=_precision("bf16")))
    assert got == {"model": {"torch.bfloat16"}, "main": {"torch.float32"}, "state": {"torch.float32"},
                   "grad_buffers": {"torch.float32"}, "optimizer": "Float16OptimizerWithFloat16Params"}, got

    from torch.distributed.checkpoint import FileSystemReader

    ckpt = runs / "bf16" / "checkpoints" / "iter_0000020"
    meta = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    dtypes = {k: str(v.properties.dtype) for k, v in meta.items() if hasattr(v, "properties")}
    main = {k: d for k, d in dtypes.items() if k.startswith("optimizer.state.fp32_param.")}
    adam = {k: d for k, d in dtypes.items()
            if k.startswith(("optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."))}
    weights = {k: d for k, d in dtypes.items() if not k.startswith("optimizer.")}
    assert main and set(main.values()) == {"torch.float32"}, main
    assert adam and set(adam.values()) == {"torch.float32"}, adam
    assert set(weights.values()) == {"torch.bfloat16"}, weights
    assert json.loads((ckpt / "bio_megatron.json").read_text())["compute_dtype"] == "bfloat16"


def test_fp16_overflow_skips_steps_and_halves_the_scale(pubmed_prefix, tmp_path):
    # 2^26 overflows fp16 (max 65504) in the first backward; hysteresis 1 halves the scale at every
    # overflow, so training starts once the scale is low enough (2^18 on this model: 8 skipped steps).
    steps, init = 16, 2.0**26
    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "fp16", steps=steps, extra=_precision(
        "16-mixed", f"model.native_amp_init_scale={init}", "model.hysteresis=1")))
    recs = _records(tmp_path / "fp16")
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert {r["compute_dtype"] for r in recs} == {"float16"}
    first_update = next(i for i, r in enumerate(recs) if r["grad_norm"] is not None)
    assert first_update >= 6, "2^26 must overflow for many steps"
    assert [r["skipped_steps"] for r in recs[:first_update]] == list(range(1, first_update + 1))
    # Every skipped step halves the scale (hysteresis 1), every update keeps it (growth interval 1000); a
    # routine overflow later in training (lr 1e-3 on a tiny model) follows the same rule.
    previous = init
    for r in recs:
        skipped = r["grad_norm"] is None
        assert r["loss_scale"] == (previous / 2 if skipped else previous), (r, previous)
        previous = r["loss_scale"]
    trained = [r for r in recs if r["grad_norm"] is not None]
    assert len(trained) >= 0.8 * (steps - first_update), "training proceeded after the overflows"
    assert all(r["loss"] is not None and r["grad_norm"] > 0 for r in trained)
    assert trained[-1]["loss"] < recs[0]["loss"] - 0.05, "the model learned once updates resumed"


def test_fp16_resume_after_sigterm_matches_uninterrupted(pubmed_prefix, tmp_path):
    # A scale that overflows (2^20 > the 2^18 this model takes), growth every 2 clean steps and hysteresis 2:
    # the scaler's scale, growth and hysteresis trackers all change during the run, and a resume that lost
    # any of them would log different scales or skip different steps.
    steps = 10
    scaler = _precision("16", f"model.native_amp_init_scale={2.0**20}", "model.native_amp_growth_interval=2")
    run_world(2, pretrain_rank, overrides(pubmed_prefix, tmp_path, "ref", tp=2, steps=steps, extra=scaler))
    ref = _records(tmp_path / "ref")
    assert len({r["loss_scale"] for r in ref}) > 2 and ref[-1]["skipped_steps"] > 0, ref

    over = overrides(pubmed_prefix, tmp_path, "sigterm", tp=2, steps=steps, extra=scaler)
    world = start_world(2, pretrain_rank, over)
    _wait_for(lambda: (tmp_path / "sigterm" / "metrics.jsonl").exists()
              and len(_records(tmp_path / "sigterm")) >= 3)
    os.kill(world.pids()[1], signal.SIGTERM)
    assert world.join() == ["interrupted", "interrupted"]
    stopped = json.loads((tmp_path / "sigterm" / "status.json").read_text())["step"]
    assert 3 <= stopped < steps
    assert run_world(2, pretrain_rank, over) == ["finished", "finished"]
    got = {r["step"]: r for r in _records(tmp_path / "sigterm")}  # the resumed run's record for a step wins
    assert sorted(got) == list(range(1, steps + 1))
    # Bit-exact: the same loss, gradient norm (None = the step was skipped), loss scale and count of skipped
    # steps (kept in the checkpoint) at every step.
    keys = ("loss", "grad_norm", "loss_scale", "skipped_steps")
    for r in ref:
        g = got[r["step"]]
        assert [g[k] for k in keys] == [r[k] for k in keys], (r["step"], g, r)


def _logged_rank(over: list[str], log_file: Path) -> str:
    """pretrain_rank, with this rank's log also written to ``log_file`` (the parent cannot see a fork's records)."""
    import logging

    handler = logging.FileHandler(f"{log_file}.{os.environ['RANK']}")
    logging.getLogger("bio_megatron").addHandler(handler)
    return pretrain_rank(over)


def _resume(prefix: Path, root: Path, name: str, ckpt: Path, precision: str, tp: int = 1, pp: int = 1
            ) -> tuple[dict, str]:
    """Steps 3-4 of a run resumed from ``ckpt``: (losses, rank 0's log)."""
    run_world(tp * pp, _logged_rank, overrides(prefix, root, name, tp=tp, pp=pp, steps=4, extra=_precision(
        precision, f"exp_manager.resume_from_checkpoint={ckpt}")), root / f"{name}.log")
    return losses(root / name), (root / f"{name}.log.0").read_text()


def test_bf16_checkpoint_resumes_reshards_and_crosses_precision(pubmed_prefix, tmp_path):
    for name, p, tp in (("bf16", "bf16", 2), ("fp32", "32", 1)):
        run_world(tp, pretrain_rank, overrides(pubmed_prefix, tmp_path, name, tp=tp, steps=4, every=2,
                                               extra=_precision(p)))
    bf16, fp32 = losses(tmp_path / "bf16"), losses(tmp_path / "fp32")
    bf16_ckpt, fp32_ckpt = (tmp_path / n / "checkpoints" / "iter_0000002" for n in ("bf16", "fp32"))

    # Same precision and layout: bit-exact (fp32 main parameters, Adam state, scheduler and RNG all restored).
    same, _ = _resume(pubmed_prefix, tmp_path, "same", bf16_ckpt, "bf16", tp=2)
    assert (same[3], same[4]) == (bf16[3], bf16[4]), (same, bf16)
    # Resharded TP2 -> PP2: the same state, rounded in bf16 along other reductions (bound: see the layout test).
    pp2, log = _resume(pubmed_prefix, tmp_path, "pp2", bf16_ckpt, "bf16", pp=2)
    assert pp2[3] == pytest.approx(bf16[3], abs=2e-3) and pp2[4] == pytest.approx(bf16[4], abs=2e-3), (pp2, bf16)
    assert "trained in" not in log and "compute dtype bfloat16 (fp32 main parameters" in log

    # Across precisions: the weights carry over (step 3's loss is a forward of the step-2 weights, so it matches
    # within bf16's rounding of one forward, 5e-3 as in test_bf16_follows_fp32; a model left at its initial
    # weights would be 0.1 away), the Adam state starts afresh, and the log says so.
    to_fp32, log = _resume(pubmed_prefix, tmp_path, "to_fp32", bf16_ckpt, "32")
    assert to_fp32[3] == pytest.approx(bf16[3], abs=5e-3) and abs(to_fp32[3] - bf16[1]) > 0.05, (to_fp32, bf16)
    assert "was trained in bfloat16, this run computes in float32: loading the model weights only" in log
    to_bf16, log = _resume(pubmed_prefix, tmp_path, "to_bf16", fp32_ckpt, "bf16")
    assert to_bf16[3] == pytest.approx(fp32[3], abs=5e-3) and abs(to_bf16[3] - fp32[1]) > 0.05, (to_bf16, fp32)
    assert "was trained in float32, this run computes in bfloat16: loading the model weights only" in log
    # The LR schedule carries over: each resumed step has the source run's learning rate.
    for name, src in (("to_fp32", "bf16"), ("to_bf16", "fp32")):
        lrs = {r["step"]: r["lr"] for r in _records(tmp_path / name)}
        assert lrs == {r["step"]: r["lr"] for r in _records(tmp_path / src) if r["step"] in (3, 4)}, (name, lrs)


def _finetune_ner(over: list[str]) -> dict:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "finetune"))
    from ft_runs import finetune_rank

    return finetune_rank("ner", over)


def test_finetuning_follows_the_same_precision_rules(tmp_path):
    quick = ["trainer.max_steps=3", "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
             "model.head.fc_dropout=0.0", "model.head.num_fc_layers=2", "model.fc_hidden_size=48",
             "model.dataset.max_eval_examples=16", "model.dataset.test_file=null", "trainer.val_check_interval=3",
             "model.micro_batch_size=4", f"exp_manager.exp_dir={tmp_path}"]
    runs = {p: run_world(1, _finetune_ner, quick + [f"exp_manager.name=p{p}", f"trainer.precision={p}",
                                                    "model.native_amp_init_scale=65536"])[0]
            for p in ("32", "bf16", "16-mixed")}
    ref = runs["32"]["losses"]
    # Same bounds as pretraining: bf16 within 5e-3 (measured max 1.9e-4); fp16 keeps 11 significant bits
    # (4x finer than bf16), bound 1.2e-3 (measured max 2e-5).
    for p, bound in (("bf16", 5e-3), ("16-mixed", 1.2e-3)):
        got = runs[p]["losses"]
        assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, ref)) < bound, (p, got, ref)
    fp16 = [h for h in runs["16-mixed"]["history"] if "loss" in h]
    assert [h["loss_scale"] for h in fp16] == [65536.0] * 3 and fp16[-1]["skipped_steps"] == 0
    assert all("loss_scale" not in h for h in runs["bf16"]["history"])


def _export(ckpt: Path, out: Path, dtype: str) -> dict:
    from bio_megatron.formats.hf.convert import export_hf

    return export_hf(ckpt, out, dtype=dtype)


def test_export_hf_from_a_bf16_run_writes_the_asked_dtype(runs, tmp_path):
    from safetensors.torch import load_file

    ckpt = runs / "bf16" / "checkpoints" / "iter_0000020"
    for dtype in ("fp32", "bf16"):
        run_world(1, _export, ckpt, tmp_path / dtype, dtype)
    fp32, bf16 = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("fp32", "bf16"))
    assert {str(v.dtype) for v in fp32.values()} == {"torch.float32"}
    assert {str(v.dtype) for v in bf16.values()} == {"torch.bfloat16"}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    # fp32 comes from the fp32 main parameters (not the bf16 weights upcast), and the bf16 export is exactly
    # their rounding, as the bf16 weights the run computed with were.
    assert all(torch.equal(fp32[k].bfloat16(), bf16[k]) for k in fp32)
    assert any(not torch.equal(fp32[k], bf16[k].float()) for k in fp32)


def test_distributed_optimizer_bf16_resumes_exactly_and_exports_main_params(pubmed_prefix, tmp_path):
    """DP2 with the distributed optimizer: its fp32 main-parameter shards are saved (fully_reshardable, under
    ``optimizer.state.param.*``), restored bit-exactly, and used when the weights are read in fp32."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader

    def run(name: str, *extra: str) -> dict:
        run_world(2, pretrain_rank, overrides(pubmed_prefix, tmp_path, name, distopt=True, steps=4, every=2,
                                              extra=_precision("bf16", *extra)))
        return losses(tmp_path / name)

    ref = run("ref")
    ckpt = tmp_path / "ref" / "checkpoints" / "iter_0000002"
    got = run("resumed", f"exp_manager.resume_from_checkpoint={ckpt}")
    assert (got[3], got[4]) == (ref[3], ref[4]), (got, ref)
    meta = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    main = {str(v.properties.dtype) for k, v in meta.items() if k.startswith("optimizer.state.param.")}
    assert main == {"torch.float32"}
    run_world(1, _export, ckpt, tmp_path / "hf", "fp32")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    # Main parameters, not bf16 weights upcast: some values are not representable in bf16.
    assert any(not torch.equal(w, w.bfloat16().float()) for w in weights.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for machines without a GPU")
def test_float16_without_a_gpu_warns_once_and_names_what_to_use(caplog):
    """NeMo's configs say ``precision: 16``; run as they are on a CPU they crawl (float16 matmuls in software: 1.6
    GFLOP/s against 96 for float32 on this project's machine), so the precision is named with what to use."""
    import logging

    from bio_megatron.models.bert import _warn_cpu_float16, precision_dtype

    _warn_cpu_float16.cache_clear()  # once per process: another test may have asked already
    project = logging.getLogger("bio_megatron")  # it does not propagate to the root logger caplog listens on
    project.addHandler(caplog.handler)
    try:
        assert [precision_dtype(p) for p in ("32", "bf16-mixed")] == [torch.float32, torch.bfloat16]
        assert not [r for r in caplog.records if "precision" in r.getMessage()]
        assert precision_dtype("16-mixed") == precision_dtype(16) == torch.float16
    finally:
        project.removeHandler(caplog.handler)
    (warned,) = [r.getMessage() for r in caplog.records if "trainer.precision=16" in r.getMessage()]
    assert "trainer.precision=32" in warned and "bf16" in warned
