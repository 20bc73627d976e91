"""The CPU shim redirects megatron-core's CUDA sites to the CPU in megatron-core's modules only: a TP2xPP2 train
step (1F1B over two micro-batches, p2p, tied embeddings across stages, DDP buffers, clipping, Adam) runs with no
global TorchFunctionMode, the shim's log names the megatron sites it rewrote, and code outside megatron-core still
sees plain torch (a CUDA tensor asked for there fails as it would without the shim)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from harness import run_world

SEQ, MB, VOCAB = 32, 2, 1000


def _tp2pp2_step(log_prefix: str) -> dict:
    os.environ["MCORE_SHIM_LOG"] = log_prefix
    import sys

    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bio_megatron.bench.pretrain_common import synthetic_batch
    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.optimizer import build_optimizer
    from bio_megatron.training.pretrain import build_stage, forward_step

    init_distributed()
    init_model_parallel(2, 2, 1234)
    cfg = PretrainConfig()
    cfg.model = ModelConfig(size="tiny", encoder_seq_length=SEQ, max_position_embeddings=64, micro_batch_size=MB,
                            global_batch_size=2 * MB, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    _, ddp = build_stage(cfg, VOCAB, torch.float32)
    optimizer = build_optimizer(cfg.model.optim, [ddp], torch.float32, clip_grad=1.0, use_distributed_optimizer=False)
    batch = {k: v for k, v in synthetic_batch(VOCAB, MB, SEQ, False).items() if v is not None}
    ddp.zero_grad_buffer()
    out = get_forward_backward_func()(forward_step_func=partial(forward_step, binary_head=False),
                                      data_iterator=iter([batch, batch]), model=[ddp], num_microbatches=2,
                                      seq_length=SEQ, micro_batch_size=MB, forward_only=False)
    ok, grad_norm, _ = optimizer.step()
    try:
        torch.zeros(1, device="cuda")  # this module is not megatron-core: no redirection here
        outside = "created"
    except (RuntimeError, AssertionError) as exc:
        outside = type(exc).__name__
    megatron = {n: m for n, m in sys.modules.items() if n.startswith("megatron.core") and hasattr(m, "torch")}
    return {"ok": ok, "grad_norm": grad_norm, "losses": [float(o["loss"]) for o in out],
            "last_stage": ps.is_pipeline_last_stage(),
            "mode_enabled": torch._C._is_torch_function_mode_enabled(), "outside": outside,
            "plain_torch_modules": sorted(n for n, m in megatron.items() if m.torch is torch),
            "megatron_modules": len(megatron)}


def test_tp2pp2_step_rewrites_megatron_sites_only(tmp_path):
    results = run_world(4, _tp2pp2_step, str(tmp_path / "shim"), timeout=240)
    for r in results:
        assert r["ok"] and r["grad_norm"] > 0
        assert not r["mode_enabled"]  # no global TorchFunctionMode any more
        assert r["outside"] != "created"
        assert r["megatron_modules"] > 100 and r["plain_torch_modules"] == []
    last = [r for r in results if r["last_stage"]]
    assert len(last) == 2 and all(len(r["losses"]) == 2 for r in last)
    assert last[0]["losses"] == last[1]["losses"]  # both TP ranks of the last stage agree on the loss

    sites = {line.split(" ", 1)[0].rsplit(":", 1)[0] + " " + line.split(" ", 1)[1]
             for f in tmp_path.glob("shim.*") for line in Path(f).read_text().splitlines()}
    expected = {  # one site per mechanism and subsystem a pipelined train step goes through
        "megatron/core/pipeline_parallel/schedules.py zeros(device='cuda')",  # token count
        "megatron/core/pipeline_parallel/p2p_communication.py empty(device=0)",  # receive buffers
        "megatron/core/models/common/language_module/language_module.py Tensor.cuda()",  # tied embedding, PP>1
        "megatron/core/distributed/param_and_grad_buffer.py zeros(device=0)",  # DDP grad buffer
        "megatron/core/optimizer/clip_grads.py zeros(device='cuda')",
        "megatron/core/optimizer/clip_grads.py Tensor.type() spoofed",
        "megatron/core/optimizer/optimizer.py tensor(device='cuda')",
    }
    assert expected <= sites, sorted(sites)
    rewritten = {s for s in sites if not s.split(" ", 1)[1].startswith("torch.cuda.")}
    assert all(s.startswith("megatron/core/") for s in rewritten), sorted(rewritten)
