"""Outside oracle for the post-LN family: a random tiny Hugging Face ``BertForPreTraining`` (saved with
``save_pretrained``, no downloads) imported with ``import hf`` gives transformers' MLM and NSP logits at TP1 and,
resharded by dist-checkpointing, at TP2xPP2 (padded batch, non-padded positions compared); ``export hf`` writes a
folder transformers loads with the same logits; configs the engine cannot reproduce are refused; ``finetune ner``
runs from the imported checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from finetune.ft_runs import finetune_rank
from harness import run_world

ROOT = Path(__file__).resolve().parents[2]
VOCAB_FILE = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_cased_vocab.txt"  # 28,996: padded to 29,056
SEQ = 48
EPS = 1e-7  # not BERT's 1e-12: shows layer_norm_eps is carried over


def _make_hf(folder: str) -> dict:
    import torch
    from transformers import BertConfig, BertForPreTraining

    vocab = sum(1 for _ in open(VOCAB_FILE, encoding="utf-8"))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=EPS,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
    hf = BertForPreTraining(cfg).eval()
    with torch.no_grad():  # LayerNorm gains and all biases too, so that no mapping hides behind 1s and 0s
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.1)
    hf.save_pretrained(folder)
    (Path(folder) / "vocab.txt").write_text(VOCAB_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    ids, amask, types = _batch(vocab)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    # numpy: tensors would cross the result queue through shared memory that dies with the child
    return {"vocab": vocab, "mlm": out.prediction_logits.numpy(), "nsp": out.seq_relationship_logits.numpy()}


def _batch(vocab: int):
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (3, SEQ), generator=g)
    lens = torch.tensor([SEQ, 41, 24])
    amask = (torch.arange(SEQ)[None] < lens[:, None]).long()
    types = (torch.arange(SEQ)[None] >= (lens[:, None] // 2)).long() * amask
    return ids, amask, types


def _import(hf_dir: str, out: str) -> dict:
    from bio_megatron.export.hf import import_hf

    return import_hf(hf_dir, out)


def _our_logits(ckpt: str, tp: int, pp: int, attention: str = "unfused"):
    """MLM logits (gathered over TP) and NSP logits of the imported checkpoint at this layout, on the last stage."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.tasks.model import resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint

    init_distributed()
    init_model_parallel(tp, pp, seed=1)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                    bert_binary_head=True, hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local",
                    attention_backend=attention)
    m.make_vocab_size_divisible_by = src.padded_vocab // tp  # the saved padding, sharded over TP
    vocab = sum(1 for _ in open(src.vocab_file, encoding="utf-8"))
    model = build_model(m, vocab).eval()
    load_checkpoint(src.path, model, model_only=True)
    ids, amask, types = _batch(vocab)

    def step(_, mdl):
        out = mdl(ids, amask, tokentype_ids=types)
        if not ps.is_pipeline_last_stage():
            return out, None  # hidden states for the next stage
        logits, nsp = out
        return logits, lambda t, non_loss_data=True: (gather_from_tensor_model_parallel_region(t), nsp)

    with torch.no_grad():
        data = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[model],
                                           num_microbatches=1, seq_length=SEQ, micro_batch_size=3,
                                           forward_only=True, collect_non_loss_data=True)
    if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0):
        return None
    logits, nsp = data[0]
    return {"mlm": logits[..., :vocab].numpy(), "nsp": nsp.numpy(), "padded_max": logits[..., vocab:].max().item(),
            "block_type": m.transformer_block_type}


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import BertForPreTraining

    from bio_megatron.export.hf import export_hf

    info = export_hf(ckpt, out)
    hf = BertForPreTraining.from_pretrained(out).eval()
    ids, amask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        o = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    return {"class": info["class"], "mlm": o.prediction_logits.numpy(), "nsp": o.seq_relationship_logits.numpy(),
            "config": json.loads((Path(out) / "config.json").read_text())}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_bert")
    (ref,) = run_world(1, _make_hf, str(root / "hf"))
    (info,) = run_world(1, _import, str(root / "hf"), str(root / "ckpt"))
    assert info["task"] is None
    return root, ref


def _diffs(got: dict, ref: dict) -> tuple[float, float]:
    valid = _batch(ref["vocab"])[1].bool().numpy()  # padded query rows differ by design (masked in megatron)
    return float(abs(got["mlm"] - ref["mlm"])[valid].max()), float(abs(got["nsp"] - ref["nsp"]).max())


@pytest.mark.parametrize("tp,pp,attention", [(1, 1, "unfused"), (2, 2, "unfused"), (1, 1, "sdpa")],
                         ids=["tp1", "tp2pp2", "tp1_sdpa"])
def test_imported_bert_logits_equal_transformers(imported, tp, pp, attention):
    root, ref = imported
    res = [r for r in run_world(tp * pp, _our_logits, str(root / "ckpt"), tp, pp, attention) if r is not None]
    assert len(res) == 1 and res[0]["block_type"] == "post_ln"
    mlm, nsp = _diffs(res[0], ref)
    assert abs(ref["mlm"]).max() > 1.0  # non-trivial logits
    assert mlm < 1e-4 and nsp < 1e-4, (mlm, nsp)
    assert res[0]["padded_max"] == float("-inf")  # padded vocabulary entries can never be predicted


def test_export_loads_in_transformers_with_same_logits(imported):
    root, ref = imported
    (res,) = run_world(1, _export_and_reload, str(root / "ckpt"), str(root / "export"))
    assert res["class"] == "BertForPreTraining"
    assert res["config"]["model_type"] == "bert" and res["config"]["layer_norm_eps"] == EPS
    mlm, nsp = _diffs(res, ref)
    assert mlm < 1e-4 and nsp < 1e-4, (mlm, nsp)


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ({"is_decoder": True}, "is_decoder"),
    ({"model_type": "roberta"}, "RoBERTa imports as"),  # a Bert* class under model_type roberta
])
def test_refuses_configs_it_cannot_reproduce(imported, tmp_path, change, message):
    from bio_megatron.tasks.model import resolve_source
    from bio_megatron.utils.errors import CheckpointError

    root, _ = imported
    cfg = json.loads((root / "hf" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=message):
        resolve_source(tmp_path)


def _bare_encoder_parity(hf_dir: str, ckpt: str) -> dict:
    """A bare HF ``BertModel`` (MiniLM-style: no MLM head, no ``bert.`` prefix) imported, then loaded into the
    fine-tuning model (encoder + identity head = the last hidden states), from the checkpoint and from the
    HF folder itself: both equal transformers' ``last_hidden_state``."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    from bio_megatron.config.finetune import NerModelConfig
    from bio_megatron.export.hf import import_hf
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.tasks.model import apply_source_shape, build_task_model, load_into, resolve_source

    vocab = sum(1 for _ in open(VOCAB_FILE, encoding="utf-8"))
    torch.manual_seed(1)
    cfg = BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, initializer_range=0.2)
    hf = BertModel(cfg).eval()
    hf.save_pretrained(hf_dir)
    (Path(hf_dir) / "vocab.txt").write_text(VOCAB_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    import_hf(hf_dir, ckpt)
    init_distributed()
    init_model_parallel(1, 1, seed=1)
    ids, amask, types = _batch(vocab)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=amask, token_type_ids=types).last_hidden_state
    valid = amask.bool()
    out = {}
    for name, path in (("checkpoint", ckpt), ("hf_folder", hf_dir)):
        src = resolve_source(path)
        m = NerModelConfig(hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local")
        apply_source_shape(m, src)
        model = build_task_model(m, src.padded_vocab or 29056, nn.Identity(), torch.float32, seed=0,
                                 pre_process=True, post_process=True).eval()
        load_into(model, src, encoder_only=True)
        with torch.no_grad():
            ours = model(ids, amask, types)
        out[name] = float((ours - theirs)[valid].abs().max())
    return out


def test_bare_bert_encoder_imports_with_equal_hidden_states(tmp_path):
    (res,) = run_world(1, _bare_encoder_parity, str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    assert res["checkpoint"] < 1e-4 and res["hf_folder"] < 1e-4, res


def _export_finetuned(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    from bio_megatron.export.hf import export_hf
    from bio_megatron.predict.common import load_finetuned

    info = export_hf(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(["Naloxone reverses the effect of clonidine.", "Cocaine"], padding=True, return_tensors="pt")
    loaded = load_finetuned(ckpt)
    hf = BertForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
        theirs = hf(**enc).logits
    valid = enc["attention_mask"].bool()
    return {"class": info["class"], "diff": float((ours - theirs)[valid].abs().max()),
            "scale": float(ours[valid].abs().max())}


def test_finetune_ner_from_imported_bert_and_export(imported, tmp_path):
    root, _ = imported
    over = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", "model.max_position_embeddings=64", "model.dataset.max_seq_length=64",
            f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ner", f"model.restore_from_path={root / 'ckpt'}"]
    (res,) = run_world(1, finetune_rank, "ner", over)
    assert len(res["losses"]) == 3 and all(0.0 < v < 10.0 for v in res["losses"]), res["losses"]
    saved = (tmp_path / "ner" / "checkpoints").rglob("config.yaml")
    assert any("transformer_block_type: post_ln" in p.read_text() for p in saved)
    (exp,) = run_world(1, _export_finetuned, str(tmp_path / "ner" / "checkpoints"), str(tmp_path / "hf_ner"))
    assert exp["class"] == "BertForTokenClassification" and exp["scale"] > 0.01 and exp["diff"] < 1e-4, exp
