"""Packed sequences for ModernBERT (``config/packing.py`` lets the family pack): its attention takes the per-example
block mask with its local band inside it, and its rotary positions restart per example.

- Fine-tuning (``model.dataset.packing: true``): a tiny ModernBERT NER / classification model (random weights, an
  8-token local window that bites, ModernBERT's own head; classification with [CLS] and with mean pooling) on the
  tasks' real micro-batches: the packed batch gives the unpacked batch's per-example logits, loss and every
  parameter gradient.
- Pretraining (``model.data.packing: documents``, ``model.objective: mlm``: the RoBERTa rows of whole documents): a
  packed ``tiny_modernbert`` run through the real pretraining path gives the same losses at TP2 as at TP1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import losses, overrides

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"ner": ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml",
           "classify": ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"}
MODERNBERT = ["model.family=modernbert", "model.num_tokentypes=0", "model.ffn_hidden_size=96",
              "model.layernorm_epsilon=1e-5", "model.local_attention=8", "model.global_attn_every_n_layers=3",
              "model.global_rope_theta=1000.0", "model.local_rope_theta=50.0"]
QUIET = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.dataset.max_train_examples=16",
         "model.dataset.max_eval_examples=16"]
HEAD = {"ner": "model.head.fc_dropout=0.0", "classify": "model.classifier_head.fc_dropout=0.0"}


def _packed_vs_unpacked(name: str, *extra: str) -> dict:
    """One real micro-batch of ``name`` through a fresh tiny ModernBERT TaskModel, unpacked and packed."""
    import torch

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families.task import build_task_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.tasks.packing import model_inputs, pack
    from bio_megatron.tasks.protocol import TASKS
    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.builtin import resolve_vocab

    init_distributed()
    init_model_parallel(1, 1, seed=3)
    os.chdir(ROOT)  # the recipes name their fixture data relative to the checkout
    over = [*MODERNBERT, *QUIET, HEAD[name], "model.dataset.packing=true", *extra]
    cfg = load_finetune_config(name, RECIPES[name], over, 1)
    m = cfg.model
    tokenizer = load_tokenizer(resolve_vocab(m.tokenizer.vocab_file), m.tokenizer.do_lower_case)
    task = TASKS[name](cfg, tokenizer, None)
    model = build_task_model(m, padded_vocab_size(tokenizer.vocab_size, m.make_vocab_size_divisible_by, 1),
                             task.build_head(m), torch.float32, 7)
    init_weights(model, 7, 0.2, m.shape().num_layers)  # wide weights: attention far from uniform
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
    return {"head": type(model.head).__name__, "pooling": getattr(model.head, "pooling", None),
            "rows": int(packed["packed_input_ids"].shape[0]), "examples": len(indices), "seq": seq,
            "logits": float(diff.abs().max()), "loss": abs(p_loss - u_loss),
            "grads": sorted(p_grad) == sorted(u_grad),
            "grad_rel": max(float((p_grad[k] - u_grad[k]).abs().max() / u_grad[k].abs().max().clamp(min=1e-12))
                            for k in u_grad),
            "outputs": task.outputs(p_logits, packed) == task.outputs(u_logits, batch)}


# classify-mean: model.classifier_head.pooling=mean, each example's mean over its own tokens in the packed row
@pytest.mark.parametrize("name,pooling", [("ner", None), ("classify", "cls"), ("classify", "mean")])
def test_packed_modernbert_batch_equals_unpacked(name, pooling):
    extra = [f"model.classifier_head.pooling={pooling}"] if pooling else []
    r = run_world(1, _packed_vs_unpacked, name, *extra)[0]
    print(f"{name}: {r['examples']} examples in {r['rows']} packed rows; max |logit diff| {r['logits']:.2e}, "
          f"|loss diff| {r['loss']:.2e}, max relative gradient diff {r['grad_rel']:.2e}")
    assert r["head"] == "ModernBertTaskHead" and r["pooling"] == pooling and r["seq"] > 8  # the window bites
    assert r["rows"] < r["examples"]  # several examples share a row
    assert r["logits"] < 1e-5 and r["loss"] < 1e-6 and r["outputs"]
    assert r["grads"] and r["grad_rel"] < 1e-4


def _modernbert_rank(over: list[str]) -> dict:
    from layouts import pretrain_rank

    return pretrain_rank(ROOT / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml", over)


def _multi_document_rows(prefix: str, seq: int, rows: int) -> int:
    """How many of the first ``rows`` packed rows of ``prefix`` hold more than one document part."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from bio_megatron.data.roberta import RobertaDataset
    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.builtin import resolve_vocab

    indexed = IndexedDataset(prefix)
    data = RobertaDataset(indexed, (0, len(indexed.document_indices) - 1), 0, seq,
                          load_tokenizer(resolve_vocab("bert_base_cased"), False), 0.3, 1234, "train",
                          packing="documents")
    return sum(int(data[i]["padding_mask"].max() > 1) for i in range(min(rows, len(data))))


def test_packed_modernbert_pretraining_tp2_equals_tp1(pubmed_prefix, tmp_path):
    """4 steps of packed MLM rows (whole documents, no attention across them) at TP1 and TP2: the same losses."""
    (multi,) = run_world(1, _multi_document_rows, str(pubmed_prefix), 64, 32)
    assert multi > 0  # rows the run reads do pack several documents
    packed = ["model.objective=mlm", "model.data.masking=token", "model.data.packing=documents",
              "model.encoder_seq_length=64", "model.max_position_embeddings=64"]
    runs = {}
    for name, tp in (("tp1", 1), ("tp2", 2)):
        over = overrides(pubmed_prefix, tmp_path, name, tp=tp, steps=4) + packed
        run_world(tp, _modernbert_rank, over)
        runs[name] = losses(tmp_path / name)
    assert sorted(runs["tp1"]) == sorted(runs["tp2"]) == [1, 2, 3, 4], runs
    assert all(5.0 < v < 12.0 for v in runs["tp1"].values()), runs
    worst = max(abs(runs["tp1"][s] - runs["tp2"][s]) for s in runs["tp1"])
    assert worst < 1e-5, runs
