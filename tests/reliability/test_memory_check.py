"""A model whose weights, gradients and optimizer state cannot fit is refused before anything is allocated.

- The per-rank parameter estimate equals the parameters megatron-core really builds on each rank (tiny at TP1,
  TP2 and PP2, counted in forked gloo worlds), and the exact count of ``--dry-run`` at TP1.
- ``check_fits`` against a given available memory: refused in one line giving the estimate, the memory and
  what to change; accepted when it fits; the distributed optimizer's sharding over DP lowers the estimate.
- The real CLI refuses a huge shape in seconds (exit 2, one line), and ``--dry-run`` shows the estimate.
"""

from __future__ import annotations

import json
import time

import pytest
from harness import run_world

from engine.pretrain_runs import TINY, overrides
from reliability.cli_log import run_cli as run_cli_here
from reliability.test_checkpoint_integrity import run_cli


def _count_rank(tp: int, pp: int) -> tuple[int, int]:
    """(parameters this rank really holds, the estimate for the most loaded rank)."""
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.memory import parameters_per_rank

    cfg = load_pretrain_config(TINY, [f"model.tensor_model_parallel_size={tp}",
                                      f"model.pipeline_model_parallel_size={pp}"], world_size=tp * pp)
    init_distributed()
    init_model_parallel(tp, pp, 1234)
    padded = padded_vocab_size(30522, cfg.model.make_vocab_size_divisible_by, tp)
    model = build_model(cfg.model, 30522, torch.float32)
    return sum(p.numel() for p in model.parameters()), parameters_per_rank(cfg.model, padded)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "pp2"])
def test_estimate_is_the_parameters_each_rank_builds(tp, pp):
    results = run_world(tp * pp, _count_rank, tp, pp)
    real = [r[0] for r in results]
    assert max(real) == results[0][1], results


def test_estimate_at_tp1_is_the_dry_run_count():
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.config.sizes import padded_vocab_size, parameter_count
    from bio_megatron.training.memory import parameters_per_rank

    for size in ("345m", "1.2b"):
        m = ModelConfig(size=size)
        padded = padded_vocab_size(28996)
        assert parameters_per_rank(m, padded) == parameter_count(m.shape(), padded)


def test_check_fits_refuses_in_one_line_and_accepts_what_fits():
    import torch

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.training.memory import GIB, check_fits, estimate
    from bio_megatron.utils.errors import BioMegatronError

    m = ModelConfig(size="1.2b")
    est = estimate(m, 28996 + 60, True, 1)
    # bf16: 2 (weights) + 4 (fp32 grads) + 8 (Adam) + 4 (fp32 main params) bytes per parameter
    assert est.total == 18 * est.parameters_per_rank
    with pytest.raises(BioMegatronError) as info:
        check_fits(m, 29056, torch.bfloat16, 1, available=(16 * GIB, "GPU 0 free memory", 1))
    msg = str(info.value)
    assert "\n" not in msg and info.value.exit_code == 2
    assert f"{est.total / GIB:.1f} GiB per rank" in msg and "GPU 0 free memory is 16.0 GiB" in msg, msg
    assert "activations excluded" in msg and "model.tensor_model_parallel_size" in msg, msg
    assert "model.use_distributed_optimizer=true" in msg and "trainer.skip_memory_check=true" in msg, msg
    assert check_fits(m, 29056, torch.bfloat16, 1, available=(80 * GIB, "GPU 0 free memory", 1)).total == est.total
    # Ranks sharing a node's memory: 4 ranks x 22 GiB do not fit in 80 GiB.
    with pytest.raises(BioMegatronError, match="x 4 ranks on this node"):
        check_fits(m, 29056, torch.bfloat16, 1, available=(80 * GIB, "available memory", 4))
    # The distributed optimizer shards Adam state and main params over DP: 6 + 12/8 bytes per parameter.
    sharded = estimate(ModelConfig(size="1.2b", use_distributed_optimizer=True), 29056, True, 8)
    assert sharded.total == pytest.approx(7.5 * est.parameters_per_rank, rel=1e-6)


def test_cli_refuses_a_shape_that_cannot_fit_before_allocating(pubmed_prefix, tmp_path):
    # 24 layers of hidden 16384 (FFN 4x): ~77 B parameters, ~1.2 TB of fp32 state: no machine here holds that.
    over = overrides(pubmed_prefix, tmp_path, "huge", extra=("model.size=1.2b", "model.hidden_size=16384",
                                                             "model.num_attention_heads=32", "trainer.precision=32"))
    start = time.monotonic()
    rc, log = run_cli(["pretrain", "--config", str(TINY), *over], tmp_path / "cli.log")
    assert rc == 2, log[-3000:]
    assert time.monotonic() - start < 60
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    assert "the model cannot fit" in errors[0] and "activations excluded" in errors[0], errors[0]
    assert not (tmp_path / "huge" / "checkpoints").exists()


def test_dry_run_shows_the_estimate(capsys):
    rc, _ = run_cli_here(["pretrain", "--config", str(TINY), "--dry-run", "model.size=345m", "trainer.precision=32",
                          "--skip-path-checks"])  # (the recipe names no corpus)
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    mem = out["memory"]
    assert mem["parameters_per_rank"] == out["parameters"]  # TP1 PP1: every parameter on the one rank
    assert mem["static_state_gib_per_rank"] == pytest.approx(16 * out["parameters"] / 2**30, abs=1e-3)
