"""``model.optim.fused`` picks torch's Adam kernel inside megatron-core's optimizer (torch fallback, no TE/apex):
null = fused on CPU, false = torch's default (single-tensor on CPU). Checked against torch itself: megatron's step
must equal ``torch.optim.AdamW(fused=...)`` on the same parameters, gradients and groups, bit for bit; and a
checkpoint's param_groups (``load_state_dict`` takes them whole) must not switch the kernel."""

from __future__ import annotations

import pytest
import torch
from harness import run_world

STEPS = 3


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _run(fused) -> dict:
    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.optimizer import build_optimizer, torch_adams
    from bio_megatron.training.pretrain import build_stage

    init_distributed()
    init_model_parallel(1, 1, seed=3)
    cfg = PretrainConfig()
    cfg.model = ModelConfig(size="tiny", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2,
                            encoder_seq_length=16, max_position_embeddings=16)
    cfg.model.optim.fused = fused
    cfg.model.optim.lr = 1e-2  # large steps: rounding differences between kernels show up sooner
    _, ddp = build_stage(cfg, 300, torch.float32)
    opt = build_optimizer(cfg.model.optim, [ddp], torch.float32, clip_grad=0.0, use_distributed_optimizer=False)
    (inner,) = torch_adams(opt)
    # the outside truth: torch's AdamW with the same groups on copies of the parameters
    ref_params = {p: p.detach().clone().requires_grad_() for g in inner.param_groups for p in g["params"]}
    ref = torch.optim.AdamW([{**{k: v for k, v in g.items() if k not in ("params", "fused", "foreach")},
                              "params": [ref_params[p] for p in g["params"]]} for g in inner.param_groups],
                            fused=fused is not False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        for p, r in ref_params.items():
            grad = torch.randn(p.shape, generator=gen) * 1e-2
            p.main_grad.copy_(grad)
            r.grad = grad.clone()
        opt.step()
        ref.step()
    same = all(torch.equal(_bits(p), _bits(r)) for p, r in ref_params.items())
    kernel = {g["fused"] for g in inner.param_groups}
    # a checkpoint written by a run of the other kernel: its param_groups must not switch this run's kernel
    sd = inner.state_dict()
    for g in sd["param_groups"]:
        g["fused"] = None if fused is not False else True
    inner.load_state_dict(sd)
    for p in ref_params:
        p.main_grad.zero_()
    opt.step()
    return {"same_as_torch": same, "kernel": kernel, "kernel_after_load": {g["fused"] for g in inner.param_groups},
            "moved": any(not torch.equal(p, ref_params[p]) for p in ref_params)}


@pytest.mark.parametrize("fused, kernel", [(None, True), (False, None), (True, True)],
                         ids=["default-fused-on-cpu", "torch-default", "fused"])
def test_megatron_step_equals_torch_adamw_of_the_chosen_kernel(fused, kernel):
    (res,) = run_world(1, _run, fused)
    assert res["moved"]  # the steps did update the parameters
    assert res["same_as_torch"], res
    assert res["kernel"] == {kernel} and res["kernel_after_load"] == {kernel}, res
