"""LAMB (``model.optim.name: lamb``): step for step equal to an independent float64 implementation of the
published algorithm (You et al. 2020, Algorithm 2, with bias correction and decoupled weight decay, apex's
conventions for zero norms and undecayed tensors); a tiny pretraining run through megatron's wrappers whose loss
falls; TP2 and DP2 + distributed optimizer taking the TP1 steps (whole-parameter norms across shards); an exact
resume of the sharded LAMB state; unsupported options refused in one line, exit 2, nothing written."""

from __future__ import annotations

import math

import pytest
import torch
from harness import run_world

from bio_megatron.training.lamb import Lamb
from engine.pretrain_runs import TINY, losses, overrides, pretrain_rank

STEPS = 6
LAMB = ("model.optim.name=lamb", "model.optim.lr=0.1", "model.optim.sched.name=constant")


# --- the published algorithm, written from the paper (not from lamb.py) -------------------------------------------

def reference_lamb(params: dict, grads: list[dict], lr: float, b1: float, b2: float, eps: float, wd: dict,
                   bias_correction: bool) -> list[dict]:
    """x_{t+1} = x_t - lr * phi(||x_t||) / ||r_t + wd x_t|| * (r_t + wd x_t), r_t = m^/(sqrt(v^)+eps), phi = id;
    the ratio taken as 1 when a norm is zero or the tensor has no weight decay. Returns x after each step."""
    x = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in x.items()}
    v = {k: torch.zeros_like(t) for k, t in x.items()}
    history = []
    for t, g in enumerate(grads, start=1):
        for k in x:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
            m_hat = m[k] / (1 - b1 ** t) if bias_correction else m[k]
            v_hat = v[k] / (1 - b2 ** t) if bias_correction else v[k]
            r = m_hat / (torch.sqrt(v_hat) + eps)
            step = r + wd[k] * x[k]
            x_norm, s_norm = math.sqrt(float((x[k] ** 2).sum())), math.sqrt(float((step ** 2).sum()))
            trust = x_norm / s_norm if wd[k] != 0 and x_norm > 0 and s_norm > 0 else 1.0
            x[k] = x[k] - lr * trust * step
        history.append({k: t_.clone() for k, t_ in x.items()})
    return history


@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_matches_the_published_algorithm(bias_correction):
    gen = torch.Generator().manual_seed(0)
    params = {"weight": torch.randn(5, 7, generator=gen, dtype=torch.float64),
              "zero_weight": torch.zeros(3, 4, dtype=torch.float64),  # ||x|| = 0 at step 1: trust ratio 1
              "bias": torch.randn(7, generator=gen, dtype=torch.float64)}  # no weight decay: ratio 1 always
    wd = {"weight": 0.01, "zero_weight": 0.1, "bias": 0.0}
    grads = [{k: torch.randn(v.shape, generator=gen, dtype=torch.float64) * (0.1 * t) for k, v in params.items()}
             for t in range(1, 6)]
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-6
    want = reference_lamb(params, grads, lr, b1, b2, eps, wd, bias_correction)

    tensors = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    opt = Lamb([{"params": [tensors["weight"]], "weight_decay": wd["weight"]},
                {"params": [tensors["zero_weight"]], "weight_decay": wd["zero_weight"]},
                {"params": [tensors["bias"]], "weight_decay": wd["bias"]}],
               lr=lr, betas=(b1, b2), eps=eps, bias_correction=bias_correction)
    for step, g in enumerate(grads):
        for k, p in tensors.items():
            p.grad = g[k].clone()
        opt.step()
        for k, p in tensors.items():
            torch.testing.assert_close(p.detach(), want[step][k], rtol=1e-12, atol=1e-14, msg=f"{k} step {step + 1}")
    # the cases the conventions decide really occurred: the zero weight moved off zero by a plain Adam-sized step
    assert float(want[0]["zero_weight"].abs().max()) > 0
    assert all(int(g["step"]) == len(grads) for g in opt.param_groups)


# --- through megatron's wrappers: loss falls, layouts agree, resume is exact ----------------------------------------

@pytest.fixture(scope="module")
def tp1(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("lamb")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "tp1", steps=STEPS, extra=LAMB))
    ref = losses(root / "tp1")
    assert sorted(ref) == list(range(1, STEPS + 1))
    return root, ref


def test_lamb_pretraining_loss_falls(tp1):
    _, ref = tp1
    assert ref[STEPS] < ref[1] - 0.3, ref


def _same(got: dict, ref: dict, tol: float) -> None:
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=tol), (step, got, ref)


def test_lamb_tp2_matches_tp1(tp1, pubmed_prefix):
    root, ref = tp1
    run_world(2, pretrain_rank, overrides(pubmed_prefix, root, "tp2", tp=2, steps=STEPS, extra=LAMB))
    _same(losses(root / "tp2"), ref, 1e-5)


def test_lamb_dp2_distributed_optimizer_matches_tp1_and_resumes_exactly(tp1, pubmed_prefix):
    root, ref = tp1
    run_world(2, pretrain_rank, overrides(pubmed_prefix, root, "dp2", distopt=True, steps=STEPS, every=3,
                                          extra=LAMB))
    _same(losses(root / "dp2"), ref, 1e-5)
    # A new run from the step-3 checkpoint (each rank's shard of exp_avg/exp_avg_sq and the step count) takes the
    # same steps 4..6 as the run that went on.
    ckpt = root / "dp2" / "checkpoints" / "iter_0000003"
    assert ckpt.is_dir()
    run_world(2, pretrain_rank, overrides(pubmed_prefix, root, "dp2_resumed", distopt=True, steps=STEPS,
                                          extra=(*LAMB, f"exp_manager.resume_from_checkpoint={ckpt}")))
    got = losses(root / "dp2_resumed")
    assert sorted(got) == [4, 5, 6]
    _same(got, {s: losses(root / "dp2")[s] for s in (4, 5, 6)}, 1e-6)


# --- refusals -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("option, named", [
    ("model.optim.fused=true", "model.optim.fused (true)"),
    ("model.optim.amsgrad=true", "unknown key 'model.optim.amsgrad'"),
])
def test_lamb_refuses_unsupported_options(option, named, tmp_path, pubmed_prefix):
    from reliability.cli_log import run_cli

    over = overrides(pubmed_prefix, tmp_path, "refused", extra=(*LAMB, option))
    rc, msg = run_cli(["pretrain", "--config", str(TINY), *over, "--dry-run"], sep="\n")
    assert rc == 2, msg
    assert named in msg
    assert not (tmp_path / "refused").exists()


def test_bias_correction_is_lamb_only(tmp_path, pubmed_prefix):
    from reliability.cli_log import run_cli

    over = overrides(pubmed_prefix, tmp_path, "refused", extra=("model.optim.bias_correction=false",))
    rc, msg = run_cli(["pretrain", "--config", str(TINY), *over, "--dry-run"])
    assert rc == 2 and "model.optim.bias_correction (false) applies to model.optim.name lamb only" in msg, msg
