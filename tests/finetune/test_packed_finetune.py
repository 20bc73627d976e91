"""Packed fine-tuning batches (``model.dataset.packing: true``) for NER and classification.

- On the tasks' real micro-batches (tiny recipes, fixture data, fp32, dropout off): packing puts several examples
  in a row, and the per-example logits (NER: every token; classification: each example's own [CLS]), the task loss
  and every parameter gradient equal the unpacked micro-batch's.
- Whole NER and classification runs through the fine-tuning loop: packed losses and dev scores = unpacked (NER
  packed at TP2 too, extended).
- Refusals at config time (pipeline parallelism).
"""

from __future__ import annotations

import os

import pytest
from ft_runs import ROOT, finetune_rank
from harness import run_world

from reliability.cli_log import run_cli

RECIPES = {"ner": ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml",
           "classify": ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"}
QUIET = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.dataset.max_train_examples=16",
         "model.dataset.max_eval_examples=16"]
HEAD = {"ner": "model.head.fc_dropout=0.0", "classify": "model.classifier_head.fc_dropout=0.0"}


def _packed_vs_unpacked(name: str) -> dict:
    """One real micro-batch of ``name`` through a fresh tiny TaskModel, unpacked and packed."""
    import torch

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families.task import build_task_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.tasks.packing import model_inputs, pack
    from bio_megatron.tasks.protocol import TASKS
    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.builtin import resolve_vocab

    init_distributed()
    init_model_parallel(1, 1, seed=3)
    os.chdir(ROOT)  # the recipes name their fixture data relative to the checkout
    cfg = load_finetune_config(name, RECIPES[name], [*QUIET, HEAD[name], "model.dataset.packing=true"], 1)
    m = cfg.model
    tokenizer = load_tokenizer(resolve_vocab(m.tokenizer.vocab_file), m.tokenizer.do_lower_case)
    task = TASKS[name](cfg, tokenizer, None)
    model = build_task_model(m, padded_vocab_size(tokenizer.vocab_size, m.make_vocab_size_divisible_by, 1),
                             task.build_head(m), torch.float32, 7)
    model.eval()  # no dropout anywhere; gradients still flow
    indices = list(range(min(8, len(task.train.features))))
    seq = max(task.length(task.train, i) for i in indices)
    seq = int((seq + 7) // 8 * 8)
    batch = task.collate(task.train, indices, seq)
    packed = pack(batch, m.dataset.max_seq_length, tokenizer.pad)  # as the loop packs: rows of max_seq_length

    def run(b):
        model.zero_grad()
        args, kwargs = model_inputs(b)
        logits = model(*args, **kwargs)
        loss = task.loss(logits, b)
        loss.backward()
        return logits.detach(), float(loss), {k: p.grad.clone() for k, p in model.named_parameters()
                                              if p.grad is not None}

    u_logits, u_loss, u_grad = run(batch)
    p_logits, p_loss, p_grad = run(packed)
    real = batch["attention_mask"].bool()
    diff = (p_logits - u_logits)[real] if u_logits.dim() == 3 else p_logits - u_logits
    return {"rows": int(packed["packed_input_ids"].shape[0]), "examples": len(indices),
            "logits": float(diff.abs().max()), "loss": abs(p_loss - u_loss),
            "grads": sorted(p_grad) == sorted(u_grad),
            "grad_rel": max(float((p_grad[k] - u_grad[k]).abs().max() / u_grad[k].abs().max().clamp(min=1e-12))
                            for k in u_grad),
            "outputs": task.outputs(p_logits, packed) == task.outputs(u_logits, batch)}


@pytest.mark.parametrize("name", ["ner", "classify"])
def test_packed_batch_equals_unpacked(name):
    r = run_world(1, _packed_vs_unpacked, name)[0]
    print(f"{name}: {r['examples']} examples in {r['rows']} packed rows; max |logit diff| {r['logits']:.2e}, "
          f"|loss diff| {r['loss']:.2e}, max relative gradient diff {r['grad_rel']:.2e}")
    assert r["rows"] < r["examples"]  # several examples share a row
    assert r["logits"] < 1e-5 and r["loss"] < 1e-6 and r["outputs"]
    assert r["grads"] and r["grad_rel"] < 1e-4


def _finetune(name: str, over: list[str]) -> dict:
    if name == "ner":
        return finetune_rank("ner", over)
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    result = run_finetuning(load_finetune_config(name, RECIPES[name], over, int(os.environ["WORLD_SIZE"])))
    result["losses"] = [h["loss"] for h in result["history"] if "loss" in h]
    return result


@pytest.mark.parametrize("name", ["ner", "classify"])
def test_packed_finetuning_run_equals_unpacked(name, tmp_path):
    over = [*QUIET, HEAD[name], "trainer.max_steps=3", "trainer.max_epochs=null", "trainer.val_check_interval=3",
            "model.dataset.test_file=null", "model.micro_batch_size=4", "model.global_batch_size=8",
            f"exp_manager.exp_dir={tmp_path}"]
    plain = run_world(1, _finetune, name, [*over, "exp_manager.name=plain"])[0]
    packed = run_world(1, _finetune, name, [*over, "exp_manager.name=packed", "model.dataset.packing=true"])[0]
    assert len(plain["losses"]) == 3
    worst = max(abs(a - b) for a, b in zip(plain["losses"], packed["losses"]))
    print(f"{name}: packed vs unpacked max |loss diff| {worst:.2e}; dev {packed['dev']}")
    assert worst < 1e-5, (plain["losses"], packed["losses"])
    assert plain["dev"] == packed["dev"]  # the same predictions on every dev token


@pytest.mark.extended  # two gloo ranks, two runs: 7 s on an idle 2-core machine, 30 s on a busy one
def test_packed_ner_tp2_equals_unpacked_tp1(tmp_path):
    over = [*QUIET, HEAD["ner"], "trainer.max_steps=3", "trainer.max_epochs=null", "trainer.val_check_interval=3",
            "model.dataset.test_file=null", "model.micro_batch_size=4", "model.global_batch_size=8",
            f"exp_manager.exp_dir={tmp_path}"]
    plain = run_world(1, _finetune, "ner", [*over, "exp_manager.name=plain"])[0]
    tp2 = run_world(2, _finetune, "ner", [*over, "exp_manager.name=tp2", "model.dataset.packing=true",
                                          "model.tensor_model_parallel_size=2"])[0]
    assert max(abs(a - b) for a, b in zip(plain["losses"], tp2["losses"])) < 1e-5, (plain["losses"], tp2["losses"])
    assert tp2["dev"] == plain["dev"]


def test_packing_refused_with_pipeline_parallelism(tmp_path):
    rc, text = run_cli(["finetune", "ner", "--config", str(RECIPES["ner"]), "model.dataset.packing=true",
                        "model.pipeline_model_parallel_size=2", f"exp_manager.exp_dir={tmp_path}",
                        "exp_manager.name=refused"])
    assert rc == 2 and "model.dataset.packing (true) needs model.pipeline_model_parallel_size=1 (got 2)" in text, text
    assert not (tmp_path / "refused").exists()
