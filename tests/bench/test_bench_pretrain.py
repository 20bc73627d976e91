"""``bio-megatron bench pretrain`` runs end to end on CPU (tiny shape, a few seconds) and reports a real
comparison with the Hugging Face baseline, written atomically to ``--json``."""

from __future__ import annotations

import json

from harness import run_world


def _cli(argv: list[str]) -> int:
    from bio_megatron.cli import main

    return main(argv)


def test_bench_pretrain_tiny_cpu(tmp_path):
    out = tmp_path / "bench.json"
    (rc,) = run_world(1, _cli, ["bench", "pretrain", "--size", "tiny", "--steps", "2", "--warmup", "1", "--seq", "32",
                                "--micro-batch", "2", "--precision", "32", "--profile", "1", "--json", str(out)],
                  timeout=120)
    assert rc == 0
    res = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temp file left behind
    assert res["dtype"] == "float32" and res["size"] == "tiny" and res["steps"] == 2
    for side in ("ours", "hf"):
        assert res[side]["tokens_per_s"] > 0 and res[side]["tflops"] > 0
        assert res[side]["mfu_datasheet"] is None  # no peak is known for a CPU
    assert res["ours"]["attention"] == "DotProductAttention"  # CPU auto = megatron-core's unfused path
    assert res["hf"]["attention"] == "sdpa"
    assert res["hf"]["process"] == "own"  # a process of its own: no heap shared with our side
    assert res["ours"]["grad_fusion"] == "on"  # model.gradient_accumulation_fusion null = on on CPU
    # model.optim.fused null: torch's fused Adam on CPU on our side too, as the HF Trainer's default on HF's
    assert res["ours"]["optimizer"] == "AdamW (fused)" and res["hf"]["optimizer"] == "AdamW (fused)"
    assert res["ratio_tokens_per_s"] > 0
    # --profile: our side's busiest operators; the transformers side ran in another process, out of the profiler's view
    prof = res["ours"]["profile"]
    assert prof["time"] == "operator (CPU)" and prof["steps"] == 1 and prof["total_ms_per_step"] > 0
    assert prof["share_of_step"] > 0
    assert prof["top"] and all(r["ms_per_step"] > 0 and 0 < r["share"] <= 1 for r in prof["top"])
    assert [r["ms_per_step"] for r in prof["top"]] == sorted((r["ms_per_step"] for r in prof["top"]), reverse=True)
    assert any("mm" in r["name"] for r in prof["top"])  # the matmuls are among a BERT step's busiest operators
    assert "profile" not in res["hf"]
    assert abs(res["ratio_tokens_per_s"] - res["ours"]["tokens_per_s"] / res["hf"]["tokens_per_s"]) < 1e-9


def _cli_with_failing_baseline(argv: list[str]) -> str:
    import bio_megatron.bench.pretrain_runs as bench  # where the schedules look these up

    def fail(*args, **kwargs):
        raise RuntimeError("the transformers side broke")

    bench.hf_step = fail
    try:
        _cli(argv)
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_sequential_schedule_keeps_our_figures_when_the_baseline_fails(tmp_path):
    """The GPU schedule (one side after the other) writes our side to ``--json`` before the transformers side runs:
    a GPU check whose baseline fails or runs out of time still returns our throughput."""
    out = tmp_path / "bench.json"
    (err,) = run_world(1, _cli_with_failing_baseline, ["bench", "pretrain", "--size", "tiny", "--steps", "2",
                                                       "--warmup", "1", "--seq", "32", "--micro-batch", "2",
                                                       "--precision", "32", "--schedule", "sequential",
                                                       "--profile", "1",
                                                       "--json", str(out)], timeout=120)
    assert err == "the transformers side broke"
    res = json.loads(out.read_text())
    assert res["ours"]["tokens_per_s"] > 0 and res["hf"].startswith("not measured")
    assert res["ours"]["profile"]["top"]  # profiled before the baseline ran, and written with our figures


def _cli_with_failing_profiler(argv: list[str]) -> int:
    import bio_megatron.bench.pretrain_runs as bench  # where the schedules look these up

    def fail(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")  # as a sandboxed GPU's profiler may answer

    bench.profile_steps = fail
    return _cli(argv)


def test_a_failing_profiler_leaves_the_timings_and_says_why(tmp_path):
    out = tmp_path / "bench.json"
    (rc,) = run_world(1, _cli_with_failing_profiler, ["bench", "pretrain", "--size", "tiny", "--steps", "1",
                                                      "--warmup", "0", "--seq", "32", "--micro-batch", "2",
                                                      "--precision", "32", "--skip-hf", "--profile", "1",
                                                      "--json", str(out)], timeout=120)
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["ours"]["tokens_per_s"] > 0
    assert res["ours"]["profile"] == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}


def test_also_our_adam_times_our_side_again_with_the_other_kernel(tmp_path):
    """The optimizer's A/B in one run (what the GPU check needs to choose Adam's GPU default): the same model and
    batch timed again with the other kernel, after ours; refused where both sides stay resident."""
    out = tmp_path / "bench.json"
    common = ["bench", "pretrain", "--size", "tiny", "--steps", "1", "--warmup", "1", "--seq", "32",
              "--micro-batch", "2", "--precision", "32", "--skip-hf", "--also-our-adam", "default"]
    (rc,) = run_world(1, _cli, common + ["--json", str(out)], timeout=120)
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["ours"]["optimizer"] == "AdamW (fused)"  # null: the fused kernel on CPU
    alt = res["ours_adam_default"]
    assert alt["optimizer"] == "AdamW (single-tensor)" and alt["tokens_per_s"] > 0
    assert set(alt["breakdown_s"]) == {"forward_backward", "optimizer", "other"}
    (rc,) = run_world(1, _cli, ["bench", "pretrain", "--size", "tiny", "--also-our-adam", "fused",
                                "--schedule", "interleaved"], timeout=120)
    assert rc == 2


def _cli_stopped_while_profiling_the_baseline(argv: list[str]) -> int:
    import bio_megatron.bench.pretrain_runs as bench  # where the schedules look these up

    real, calls = bench.profile_steps, []

    def stop_on_second(*args, **kwargs):  # ours is profiled for real; the baseline's profiler "hangs" until killed
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    bench.profile_steps = stop_on_second
    return _cli(argv)


def test_a_run_stopped_in_the_last_profile_has_written_both_sides_timings(tmp_path):
    """The GPU check kills a step at its limit: whatever was measured before is in --json already."""
    out = tmp_path / "bench.json"
    (rc,) = run_world(1, _cli_stopped_while_profiling_the_baseline,
                       ["bench", "pretrain", "--size", "tiny", "--steps", "1", "--warmup", "1", "--seq", "32",
                        "--micro-batch", "2", "--precision", "32", "--schedule", "sequential", "--profile", "1",
                        "--json", str(out)], timeout=120)
    assert rc == 130  # the CLI's answer to an interrupt
    res = json.loads(out.read_text())
    assert res["ours"]["profile"]["top"] and res["hf"]["tokens_per_s"] > 0 and "profile" not in res["hf"]
    assert res["ratio_tokens_per_s"] > 0
