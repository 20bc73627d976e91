"""Outside oracle for the post-LN family: a random tiny Hugging Face ``BertForPreTraining`` (saved with
``save_pretrained``, no downloads) imported with ``import hf`` gives transformers' MLM and NSP logits at TP1 and,
resharded by dist-checkpointing, at TP2xPP2 (padded batch, non-padded positions compared); ``export hf`` writes a
folder transformers loads with the same logits; configs the engine cannot reproduce are refused; ``finetune ner``
runs from the imported checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from architectures.hf_parity import (VOCAB_FILE, encoder_hidden_diff, finetune_ner_and_export,
                                     imported as import_fixture, masked_max_diff, padded_batch,
                                     perturb_norms_and_biases, pipeline_logits, vocab_lines)
from harness import run_world

SEQ = 48
EPS = 1e-7  # not BERT's 1e-12: shows layer_norm_eps is carried over


def _make_hf(folder: str) -> dict:
    import torch
    from transformers import BertConfig, BertForPreTraining

    vocab = vocab_lines()
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=EPS,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
    hf = BertForPreTraining(cfg).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(folder)
    (Path(folder) / "vocab.txt").write_text(VOCAB_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    ids, amask, types = _batch(vocab)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    # numpy: tensors would cross the result queue through shared memory that dies with the child
    return {"vocab": vocab, "mlm": out.prediction_logits.numpy(), "nsp": out.seq_relationship_logits.numpy()}


def _batch(vocab: int):
    return padded_batch(vocab, SEQ, (SEQ, 41, 24))


def _our_logits(ckpt: str, tp: int, pp: int, attention: str = "unfused"):
    """MLM logits (gathered over TP) and NSP logits of the imported checkpoint at this layout, on the last stage."""
    return pipeline_logits(ckpt, tp, pp, _batch, binary_head=True, attention=attention)


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import BertForPreTraining

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = BertForPreTraining.from_pretrained(out).eval()
    ids, amask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        o = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    return {"class": info["class"], "mlm": o.prediction_logits.numpy(), "nsp": o.seq_relationship_logits.numpy(),
            "config": json.loads((Path(out) / "config.json").read_text())}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_fixture(tmp_path_factory, "hf_bert", _make_hf)


def _diffs(got: dict, ref: dict) -> tuple[float, float]:
    valid = _batch(ref["vocab"])[1].bool().numpy()
    return masked_max_diff(got["mlm"], ref["mlm"], valid), float(abs(got["nsp"] - ref["nsp"]).max())


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
    from bio_megatron.formats.source import resolve_source
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
    from transformers import BertConfig, BertModel

    from bio_megatron.formats.hf.convert import import_hf
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    vocab = vocab_lines()
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
    return {name: encoder_hidden_diff(path, ids, amask, types, theirs)
            for name, path in (("checkpoint", ckpt), ("hf_folder", hf_dir))}


def test_bare_bert_encoder_imports_with_equal_hidden_states(tmp_path):
    (res,) = run_world(1, _bare_encoder_parity, str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    assert res["checkpoint"] < 1e-4 and res["hf_folder"] < 1e-4, res


def test_finetune_ner_from_imported_bert_and_export(imported, tmp_path):
    root, _ = imported
    finetune_ner_and_export(root / "ckpt", tmp_path, "model.max_position_embeddings=64")
