"""The GPU training scenarios of ``tests/gpu``, run in one fresh process (``python scenarios.py OUT.json``).

A fresh process, not a fork of pytest: CUDA cannot be used in a child forked after the parent touched it, and one
process pays torch's and megatron-core's import once for every scenario. Each scenario builds the tiny model TP1
on the GPU through the code path of ``bio-megatron pretrain`` (``build_stage``: local spec, megatron DDP;
``build_optimizer``; ``get_forward_backward_func()``) on the synthetic MLM batch of ``bench pretrain``, and records
what the tests assert: losses, gradient differences, peak memory, errors (one line each). A scenario that raises
is recorded as ``{"error": ...}`` and the others still run.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Callable

SEED = 1234
VOCAB = 1000
CHECK_OUT = "BIO_MEGATRON_GPU_CHECK_OUT"  # benchmarks/gpu/check.sh's output folder


def _model_config(**kw: Any):
    from bio_megatron.config.pretrain import ModelConfig

    base = dict(size="tiny", encoder_seq_length=128, max_position_embeddings=128, micro_batch_size=4,
                global_batch_size=4, transformer_impl="local", attention_backend="sdpa", hidden_dropout=0.0,
                attention_dropout=0.0)  # the local spec even where Transformer Engine is importable
    return ModelConfig(**{**base, **kw})


class Stage:
    """The tiny model, its optimizer and one fixed batch, stepped like ``bio-megatron pretrain`` steps."""

    def __init__(self, precision: str = "32", seed: int = SEED, **model_kw: Any) -> None:
        import torch
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from bio_megatron.bench.pretrain_common import synthetic_batch
        from bio_megatron.config.pretrain import PretrainConfig
        from bio_megatron.models.bert import precision_dtype
        from bio_megatron.parallel.distributed import init_model_parallel
        from bio_megatron.training.optimizer import build_optimizer
        from bio_megatron.training.pretrain import to_device, build_stage

        init_model_parallel(1, 1, seed)  # also seeds megatron's CUDA RNG tracker (dropout masks)
        cfg = PretrainConfig()
        cfg.trainer.seed = SEED  # weights: the same initialisation whatever the dropout seed
        cfg.model = _model_config(**model_kw)
        self.dtype = precision_dtype(precision)
        self.model, self.ddp = build_stage(cfg, VOCAB, self.dtype)
        self.optimizer = build_optimizer(cfg.model.optim, [self.ddp], self.dtype, clip_grad=1.0,
                                         use_distributed_optimizer=False, scaler=cfg.model)
        m = cfg.model
        self.seq, self.mb = m.encoder_seq_length, m.micro_batch_size
        self.batch = to_device({k: v for k, v in synthetic_batch(VOCAB, self.mb, self.seq, False).items()
                                 if v is not None})
        self.fwd_bwd = get_forward_backward_func()
        self.attention = type(self.model.encoder.layers[0].self_attention.core_attention).__name__
        self.torch = torch

    def forward_backward(self) -> float:
        from bio_megatron.training.pretrain import forward_step

        self.ddp.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        out = self.fwd_bwd(forward_step_func=partial(forward_step, binary_head=False),
                           data_iterator=iter([self.batch]), model=[self.ddp], num_microbatches=1,
                           seq_length=self.seq, micro_batch_size=self.mb, forward_only=False)
        return float(out[0]["loss"])

    def step(self) -> float:
        loss = self.forward_backward()
        self.optimizer.step()
        return loss

    def grads(self) -> dict[str, Any]:
        return {n: p.main_grad.detach().float().clone() for n, p in self.ddp.module.named_parameters()}


def _max_rel_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in b)


def mixed_precision(precision: str) -> dict[str, Any]:
    # fp16: NeMo's initial loss scale 2**32 overflows at once and halves on every skipped step; 2**16 reaches a
    # working scale within a few steps
    s = Stage(precision, **({"native_amp_init_scale": 2.0**16} if precision == "16" else {}))
    losses = [s.step() for _ in range(10)]
    return {"attention": s.attention, "dtype": str(s.dtype), "losses": losses,
            "param_dtype": str(next(s.model.parameters()).dtype)}


def recompute() -> dict[str, Any]:
    """Gradients of one step with dropout 0.1 (fp32), each recompute setting against none; a control with another
    dropout seed shows that the masks reach the gradients. Peak memory of a bf16 step without recompute and with
    full recompute at BERT-base, seq 512, micro-batch 8 (where activations dominate)."""
    settings = {"none": {}, "selective": {"activations_checkpoint_granularity": "selective"},
                "full_uniform_1": {"activations_checkpoint_granularity": "full",
                                   "activations_checkpoint_method": "uniform", "activations_checkpoint_num_layers": 1},
                "full_block_2": {"activations_checkpoint_granularity": "full",
                                 "activations_checkpoint_method": "block", "activations_checkpoint_num_layers": 2}}
    drop = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
    ref = Stage(**drop)
    ref_loss, ref_grads = ref.forward_backward(), ref.grads()
    out: dict[str, Any] = {"losses": {"none": ref_loss}, "max_rel_grad_diff": {}}
    for name, kw in settings.items():
        if name == "none":
            continue
        s = Stage(**drop, **kw)
        out["losses"][name] = s.forward_backward()
        out["max_rel_grad_diff"][name] = _max_rel_diff(s.grads(), ref_grads)
    other = Stage(seed=SEED + 1, **drop)
    other.forward_backward()
    out["control_other_dropout_seed"] = _max_rel_diff(other.grads(), ref_grads)
    import torch

    out["peak_memory_gib"] = {}
    for name in ("none", "full_uniform_1") if torch.cuda.is_available() else ():
        torch.cuda.empty_cache()
        s = Stage("bf16", size="base", encoder_seq_length=512, max_position_embeddings=512, micro_batch_size=8,
                  global_batch_size=8, **settings[name])
        s.step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        s.step()
        torch.cuda.synchronize()
        out["peak_memory_gib"][name] = torch.cuda.max_memory_allocated() / 2**30
        # the model, its DDP and its fp32 main parameters form reference cycles (config.no_sync_func, main_param):
        # only a collection frees them, else the next setting's peak counts this one's ~0.9 GB
        del s
        gc.collect()
    return out


def grad_fusion() -> dict[str, Any]:
    """``model.gradient_accumulation_fusion=true`` on the GPU: with apex, the same gradients as unfused; without
    it, the one-line refusal."""
    from megatron.core.tensor_parallel import layers

    from bio_megatron.utils.errors import ConfigError

    out: dict[str, Any] = {"apex_fused_wgrad": bool(layers._grad_accum_fusion_available)}
    for precision in ("32", "bf16"):
        try:
            fused = Stage(precision, gradient_accumulation_fusion=True)
        except ConfigError as e:  # its problems: the message adds the "invalid configuration:" heading
            out[precision] = {"refused": e.problems}
            continue
        fused_loss = fused.forward_backward()
        unfused = Stage(precision, gradient_accumulation_fusion=False)
        out[precision] = {"losses": [fused_loss, unfused.forward_backward()],
                          "max_rel_grad_diff": _max_rel_diff(fused.grads(), unfused.grads())}
    return out


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "bf16": partial(mixed_precision, "bf16"), "fp16": partial(mixed_precision, "16"),
    "recompute": recompute, "grad_fusion": grad_fusion,
}


def main(out: str) -> int:
    import torch

    from bio_megatron.parallel.distributed import init_distributed, teardown

    results: dict[str, Any] = {"cuda": torch.cuda.is_available(),
                               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    # check.sh's folder too, after every scenario: a run killed at its time limit still leaves what it measured
    keep = [Path(out)] + ([Path(os.environ[CHECK_OUT]) / "gpu_scenarios.json"] if os.environ.get(CHECK_OUT) else [])
    init_distributed()
    try:
        for name, fn in SCENARIOS.items():
            try:
                results[name] = fn()
            except Exception as e:  # recorded; the test of that scenario fails with it, the others still run
                results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(f"scenario {name}: {json.dumps(results[name])[:400]}", file=sys.stderr, flush=True)
            for path in keep:
                _write(path, results)
    finally:
        teardown()
    return 0


def _write(path: Path, results: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
