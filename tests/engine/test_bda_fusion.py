"""``model.bias_dropout_add_fusion`` (NeMo's key; megatron-core's ``bias_dropout_fusion``, compiled by torch.compile).

Outside truths: megatron's own unfused bias-dropout-add (the same seeded model with the key false gives the same
loss and gradients, fp32, dropout off, pre-LN and post-LN, in training and in eval), the definition of inverted
dropout (the compiled function zeroes a fraction p of its sum and scales the rest by 1 / (1 - p)), and torch's
compile counter (the fused path really ran: a graph was compiled). One single-rank world: TP and PP do not touch
the fused function, which sees one rank's [s, b, h] activations either way."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from harness import run_world

VOCAB, SEQ, MICRO = 300, 16, 2


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {"text": torch.randint(5, VOCAB, (MICRO, SEQ), generator=g),
            "types": torch.zeros(MICRO, SEQ, dtype=torch.long),
            "labels": torch.randint(5, VOCAB, (MICRO, SEQ), generator=g),
            "loss_mask": (torch.rand(MICRO, SEQ, generator=g) < 0.3).long(),
            "padding_mask": torch.ones(MICRO, SEQ, dtype=torch.long)}


def _run(block: str) -> dict:
    from functools import partial

    import torch._dynamo
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.pretrain import build_stage, forward_step

    init_distributed()
    init_model_parallel(1, 1, seed=7)
    out: dict = {}
    for fused in (False, True):
        cfg = PretrainConfig()
        cfg.trainer.seed = 1234
        cfg.model = ModelConfig(size="tiny", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2,
                                encoder_seq_length=SEQ, max_position_embeddings=SEQ, micro_batch_size=MICRO,
                                global_batch_size=MICRO, hidden_dropout=0.0, attention_dropout=0.0,
                                transformer_block_type=block, bias_dropout_add_fusion=fused)
        model, ddp = build_stage(cfg, VOCAB, torch.float32)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        run = partial(get_forward_backward_func(), forward_step_func=partial(forward_step, binary_head=False),
                      model=[ddp], num_microbatches=1, seq_length=SEQ, micro_batch_size=MICRO)
        ddp.zero_grad_buffer()
        ddp.train()
        train = run(data_iterator=iter([_batch()]), forward_only=False)
        ddp.eval()
        with torch.no_grad():
            evaluation = run(data_iterator=iter([_batch()]), forward_only=True)
        out[fused] = {"config": model.config.bias_dropout_fusion, "train": float(train[0]["loss"]),
                      "eval": float(evaluation[0]["loss"]),
                      "grads": {n: p.main_grad.detach().clone() for n, p in model.named_parameters()},
                      "compiled": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs}
        if fused:  # the function the layers call, applied to a known input: inverted dropout's definition
            bda = model.encoder.layers[0].self_attn_bda(True, True)
            x, residual = torch.ones(64, 8, 32), torch.zeros(64, 8, 32)
            y = bda((x, torch.zeros(32)), residual, 0.25)
            out["dropout"] = {"values": sorted({round(v, 5) for v in y.unique().tolist()}),
                              "zero_fraction": float((y == 0).float().mean())}
    # tensors stay in the rank: only plain values cross the queue (a tensor would need the rank alive to be read)
    ref = out[False].pop("grads")
    out["grad_problems"] = [f"{n}: no gradient" for n, g in ref.items() if not g.abs().sum() > 0] + [
        f"{n}: max |diff| {(g - ref[n]).abs().max().item():.3g}" for n, g in out[True].pop("grads").items()
        if not torch.allclose(g, ref[n], rtol=1e-5, atol=1e-7)]
    return out


def _require_cxx() -> None:
    """torch.compile on the CPU builds C++ kernels: skip on a machine without a compiler, but fail under CI, whose
    tests/system_deps.sh installs g++."""
    if shutil.which(os.environ.get("CXX", "g++")) or shutil.which("clang++"):
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but no C++ compiler (tests/system_deps.sh should have installed g++)", pytrace=False)
    pytest.skip("torch.compile on the CPU needs a C++ compiler (g++ or clang++)")


@pytest.mark.parametrize("block", ["pre_ln", "post_ln"])
def test_fused_bias_dropout_add_equals_megatrons_unfused(block, monkeypatch):
    _require_cxx()
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # compile in the rank, not in a worker pool
    (res,) = run_world(1, _run, block)
    off, on = res[False], res[True]
    assert (off["config"], on["config"]) == (False, True)
    assert off["compiled"] == 0 and on["compiled"] > 0, (off["compiled"], on["compiled"])  # the fused path ran
    assert on["train"] == pytest.approx(off["train"], rel=1e-6, abs=0)
    assert on["eval"] == pytest.approx(off["eval"], rel=1e-6, abs=0)
    assert res["grad_problems"] == []
    assert res["dropout"]["values"] == [0.0, round(1 / 0.75, 5)], res["dropout"]
    assert res["dropout"]["zero_fraction"] == pytest.approx(0.25, abs=0.02)  # 16,384 draws: 5 sigma is 0.017
