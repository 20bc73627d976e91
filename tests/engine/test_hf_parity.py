"""Outside oracle: the tiny model's MLM (and NSP) logits equal Hugging Face ``MegatronBertFor*`` loaded
with the same weights through ``bio_megatron.models.hf_convert`` (TP1, fp32), and the conversion round-trips."""

from __future__ import annotations

import pytest
import torch
from harness import run_world

VOCAB = 1000  # not a multiple of 128: exercises the padding trim


def _build(binary_head: bool):
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=3)
    m = ModelConfig(size="tiny", encoder_seq_length=48, max_position_embeddings=48, hidden_dropout=0.0,
                    attention_dropout=0.0, bert_binary_head=binary_head)
    model = build_model(m, VOCAB).eval()
    init_weights(model, seed=11, std=0.2, num_layers=4)
    with torch.no_grad():  # LayerNorm gains/biases and biases too, so that no mapping hides behind 1s and 0s
        g = torch.Generator().manual_seed(5)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return m, model


def _compare(binary_head: bool) -> dict:
    from transformers import MegatronBertForMaskedLM, MegatronBertForPreTraining

    from bio_megatron.models.hf_convert import hf_config, hf_to_mcore, mcore_to_hf

    m, model = _build(binary_head)
    shape = m.shape()
    sd = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
    hsd = mcore_to_hf(sd, shape, VOCAB, binary_head=binary_head)
    hf_cls = MegatronBertForPreTraining if binary_head else MegatronBertForMaskedLM
    hf = hf_cls(hf_config(shape, VOCAB, 48, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    missing, unexpected = hf.load_state_dict(hsd, strict=False)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, VOCAB, (3, 48), generator=g)
    lens = torch.tensor([48, 41, 24])
    amask = (torch.arange(48)[None] < lens[:, None]).long()
    types = (torch.arange(48)[None] >= (lens[:, None] // 2)).long() * amask
    with torch.no_grad():
        logits, binary = model(ids, amask, tokentype_ids=types)
        out = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    hf_logits = out.prediction_logits if binary_head else out.logits
    valid = amask.bool()
    back = hf_to_mcore(hsd, shape, sd["embedding.word_embeddings.weight"].shape[0], binary_head=binary_head)
    res = {
        "missing": [k for k in missing if "position_ids" not in k], "unexpected": list(unexpected),
        "mlm_diff": (logits[..., :VOCAB] - hf_logits)[valid].abs().max().item(),
        "scale": hf_logits[valid].abs().max().item(),
        "padded_max": logits[..., VOCAB:].max().item(),
        "roundtrip": max((back[k] - sd[k][: back[k].shape[0]]).abs().max().item()
                         for k in back if "word_embeddings" not in k and "output_layer" not in k),
    }
    if binary_head:
        res["nsp_diff"] = (binary - out.seq_relationship_logits).abs().max().item()
    return res


@pytest.mark.parametrize("binary_head", [False, True], ids=["mlm", "mlm_nsp"])
def test_logits_equal_hugging_face(binary_head):
    (res,) = run_world(1, _compare, binary_head)
    assert res["missing"] == [] and res["unexpected"] == []
    assert res["scale"] > 1.0  # non-trivial logits
    assert res["mlm_diff"] < 1e-4, res
    assert res["padded_max"] == float("-inf")  # padded vocabulary entries can never be predicted
    assert res["roundtrip"] == 0.0
    if binary_head:
        assert res["nsp_diff"] < 1e-4, res
