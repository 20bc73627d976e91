"""The papers' fine-tuning protocols (issue 23 item 3): layer-wise learning-rate decay (ELECTRA / BioELECTRA) at
TP1, TP2 and PP2 read back from megatron-core's param groups; ``--grid key=v1,v2`` over any config key with
selection on dev; early stopping with patience; k-fold cross-validation (tuned on fold 1, median over 2-10)."""

from __future__ import annotations

import os
import re

import pytest
from ft_runs import RECIPES, ROOT
from harness import run_world

DECAY, LR, LAYERS = 0.8, 1e-3, 4  # the tiny size has 4 layers


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
    return {"stage": ps.get_pipeline_model_parallel_rank(), "at_1": lrs_at_1, "at_3": _by_name(model, optimizer)}


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
    # every depth occurred: embeddings, the four global layers, the head
    assert seen_layers == set(range(LAYERS))
    assert len(seen) == LAYERS + 2
