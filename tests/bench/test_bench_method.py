"""How ``bench pretrain`` compares the two sides: timed steps alternate (A B, B A, ...) after each side's warmup,
each step is broken into forward+backward / optimizer / other, and the Hugging Face baseline starts from our
model's weights (same initial loss on the same batch; measured equal to the last bit in fp32)."""

from __future__ import annotations

from harness import run_world

from bio_megatron.bench import hf_pretrain, pretrain_common
from bio_megatron.bench import pretrain as bench
from bio_megatron.bench import timing


def test_interleaved_steps_alternate_and_break_down():
    calls: list[str] = []

    def side(name: str, parts: dict[str, float]):
        def step() -> dict[str, float]:
            calls.append(name)
            return dict(parts)
        return step

    a = {"forward_backward": 0.5, "optimizer": 0.25, "other": 0.125}
    b = {"forward_backward": 1.0, "optimizer": 0.5, "other": 0.0}
    times = timing.time_steps({"a": side("a", a), "b": side("b", b)}, steps=4, warmup=2)
    assert calls == ["a", "a", "b", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]  # warmup, then ABBA
    assert times == {"a": [a] * 4, "b": [b] * 4}

    res = timing.throughput(times["a"], micro_batch=2, seq=8, flops_per_seq=1e9, peak=None, measured_peak=None,
                             memory_gib=None)
    assert res["breakdown_s"] == a and res["step_time_s"] == 0.875 and res["tokens_per_s"] == 16 / 0.875
    line = bench.summary_line({"size": "tiny", "seq": 8, "micro_batch": 2, "dtype": "float32", "device": "CPU",
                               "schedule": "interleaved", "ratio_tokens_per_s": 1.5, "ratio_median_step": 1.25,
                               "ours": {**res, "optimizer": "AdamW (single-tensor)"},
                               "hf": {**res, "optimizer": "AdamW (fused)"}})
    assert "fwd+bwd 0.5 s, optimizer 0.25 s, other 0.12 s" in line and "ours/HF 1.50x (median step 1.25x" in line


def _initial_losses() -> tuple[float, float, str]:
    import argparse

    import torch

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.pretrain import build_stage, forward_step

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--size", "tiny", "--seq", "32", "--micro-batch", "2", "--precision", "32",
                              "--vocab-size", "1000"])
    bench._resolve_defaults(args)
    init_distributed()
    init_model_parallel(1, 1, 1234)
    _, info, weights = bench.ours_step(args, torch.float32)
    hf_model = hf_pretrain.build_hf_model(args, torch.device("cpu"), weights).eval()
    # our model as ours_step builds it (initialisation is seeded): the weights the baseline was handed
    cfg = PretrainConfig()
    cfg.trainer.seed = pretrain_common.SEED
    cfg.model = ModelConfig(size="tiny", encoder_seq_length=32, max_position_embeddings=512, micro_batch_size=2,
                            global_batch_size=2)
    _, ddp = build_stage(cfg, 1000, torch.float32)
    ddp.eval()
    b = {k: v for k, v in pretrain_common.synthetic_batch(1000, 2, 32, False).items() if v is not None}
    with torch.no_grad():
        ours, _ = forward_step(iter([b]), ddp, binary_head=False)
        theirs = hf_model(input_ids=b["text"], attention_mask=b["padding_mask"], token_type_ids=b["types"],
                          labels=torch.where(b["loss_mask"].bool(), b["labels"], -100)).loss
    return float(ours), float(theirs), info["optimizer"]


def test_hf_baseline_starts_from_our_weights():
    ours, theirs, ours_opt = run_world(1, _initial_losses, timeout=120)[0]
    assert abs(ours - theirs) < 1e-5 * abs(ours), (ours, theirs)
    # megatron-core's torch fallback on CPU, switched to the fused kernel by model.optim.fused (null)
    assert ours_opt == "AdamW (fused)"


def test_hf_process_reports_the_childs_failure():
    """The HF side runs in a process of its own: its failure reaches the parent as an error with the child's
    traceback, not a hang or a silent zero."""
    import argparse

    import pytest
    import torch

    from bio_megatron.bench.hf_process import HFProcess

    with pytest.raises(RuntimeError, match="(?s)HF baseline process failed.*vocab_size"):
        HFProcess(argparse.Namespace(size="tiny"), torch.float32, {})  # no --vocab-size: hf_step cannot build
