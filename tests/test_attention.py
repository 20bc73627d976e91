"""``SDPACoreAttention`` is numerically megatron-core's unfused ``DotProductAttention`` (fp32, CPU).

Checked at three levels: the core attention alone (outputs and q/k/v gradients, with padded keys),
a whole tiny ``BioBertModel`` built with ``attention_backend=sdpa`` vs ``unfused`` on the same weights
(MLM logits, and parameter gradients relative to their scale), and the benchmark's SDPA patch of Hugging Face MegatronBert
against HF's own eager attention (so the ``bench pretrain`` baseline computes the same model).
Padded query rows differ by design (unfused masks them entirely and softmaxes a constant row), so
comparisons are on non-padded query positions only.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from harness import run_world

TOL = 1e-5
LENGTHS = {"padded": [24, 17, 9], "full": [24, 24, 24]}


def _init(seed: int = 3) -> None:
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=seed)


def _masks(lengths: list[int], s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid [b, s], megatron key-padding mask [b,1,1,s], megatron unfused mask [b,1,s,s]); True = masked."""
    valid = torch.arange(s)[None] < torch.tensor(lengths)[:, None]
    key_pad = ~valid[:, None, None, :]
    # What megatron's bert_extended_attention_mask gives the unfused path: masked if query OR key is padding.
    full = ~(valid[:, None, :, None] & valid[:, None, None, :])
    return valid, key_pad, full


def _core_attention(case: str) -> dict:
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bio_megatron.models.attention import SDPACoreAttention

    _init()
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                            hidden_dropout=0.0, use_cpu_initialization=True, apply_query_key_layer_scaling=False,
                            attention_softmax_in_fp32=True, masked_softmax_fusion=False)
    kw = dict(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.padding, attention_type="self")
    unfused, sdpa = DotProductAttention(**kw), SDPACoreAttention(**kw)
    s, b, n, h = 24, 3, 4, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, b, n, h, generator=g) * 2.0 for _ in range(3))  # * 2: peaked, non-trivial softmax
    valid, key_pad, full = _masks(LENGTHS[case], s)
    w = torch.randn(s, b, n * h, generator=g)
    rows = valid.t()  # [s, b]: non-padded query positions
    outs, grads = [], []
    for module, mask in ((unfused, full), (sdpa, key_pad)):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = module(qq, kk, vv, mask)
        (out * w * rows[..., None]).sum().backward()  # only valid query rows feed the gradient
        outs.append(out.detach())
        grads.append([t.grad for t in (qq, kk, vv)])
    return {"out_diff": (outs[0] - outs[1])[rows].abs().max().item(),
            "grad_diff": max((a - c).abs().max().item() for a, c in zip(*grads)),
            "scale": outs[0][rows].abs().max().item(), "shape_equal": outs[0].shape == outs[1].shape}


@pytest.mark.parametrize("case", list(LENGTHS))
def test_sdpa_core_attention_equals_unfused(case):
    (res,) = run_world(1, _core_attention, case)
    assert res["shape_equal"]
    assert res["scale"] > 0.1
    assert res["out_diff"] < TOL, res
    assert res["grad_diff"] < TOL, res


def _whole_model(lengths: list[int]) -> dict:
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.models.init import init_weights

    _init()
    vocab, s = 1000, 32
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (3, s), generator=g)
    labels = torch.randint(5, vocab, (3, s), generator=g)
    valid, _, _ = _masks(lengths, s)
    results = {}
    for backend in ("unfused", "sdpa"):
        m = ModelConfig(size="tiny", encoder_seq_length=s, max_position_embeddings=s, hidden_dropout=0.0,
                        attention_dropout=0.0, attention_backend=backend)
        model = build_model(m, vocab)
        init_weights(model, seed=11, std=0.2, num_layers=4)  # std 0.2: attention far from uniform
        model.eval()
        types = torch.zeros_like(ids)
        logits, _ = model(ids, valid.long(), tokentype_ids=types)
        loss = model(ids, valid.long(), tokentype_ids=types, lm_labels=labels)[0]
        (loss * valid).sum().backward()
        core = type(model.encoder.layers[0].self_attention.core_attention).__name__
        results[backend] = (core, logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (cu, lu, gu), (cs, ls, gs) = results["unfused"], results["sdpa"]
    return {"cores": [cu, cs], "logit_diff": (lu - ls)[..., :vocab][valid].abs().max().item(),
            "scale": lu[..., :vocab][valid].abs().max().item(),
            # Relative to each gradient's own scale: the loss sums ~70 token losses, so gradients are large.
            "grad_rel_diff": max(((gu[n] - gs[n]).abs().max() / gu[n].abs().max().clamp(min=1e-12)).item()
                                 for n in gu)}


@pytest.mark.parametrize("lengths", [[32, 25, 11], [32, 32, 32]], ids=["padded", "full"])
def test_tiny_model_sdpa_equals_unfused(lengths):
    # "full": no padding, so the model hands SDPA no mask at all (the flash-kernel path on GPU).
    (res,) = run_world(1, _whole_model, lengths)
    assert res["cores"] == ["DotProductAttention", "SDPACoreAttention"]
    assert res["scale"] > 1.0
    assert res["logit_diff"] < TOL, res
    assert res["grad_rel_diff"] < TOL, res


def test_hf_sdpa_patch_equals_hf_eager():
    """The benchmark's HF baseline with SDPA swapped in computes what HF's eager MegatronBert computes."""
    import argparse

    from bio_megatron.bench.hf_pretrain import build_hf_model

    args = argparse.Namespace(size="tiny", seq=32, vocab_size=1000, binary_head=False, hf_attention="eager")
    eager = build_hf_model(args, torch.device("cpu")).eval()
    args.hf_attention = "sdpa"
    sdpa = build_hf_model(args, torch.device("cpu")).eval()  # same seed: same weights
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (3, 32), generator=g)
    valid, _, _ = _masks([32, 20, 7], 32)
    with torch.no_grad():
        a = eager(input_ids=ids, attention_mask=valid.long()).logits
        b = sdpa(input_ids=ids, attention_mask=valid.long()).logits
    assert a.abs().max() > 0.1
    assert (a - b)[valid].abs().max().item() < TOL


@pytest.mark.parametrize("family", ["megatron_bert", "albert", "modernbert"])
def test_gpu_config_asks_megatron_for_no_fused_kernel_it_lacks(family, monkeypatch):
    """The TransformerConfig a GPU gets, built here as a GPU would build it: megatron's fused bias-GELU is off
    (``fusions/fused_bias_gelu.py`` computes the tanh approximation, not the exact GELU of the CPU path and of the
    HF checkpoints), and its fused masked softmax is off without the compiled ``scaled_masked_softmax_cuda``: with
    it on, megatron's shape check imports that module unguarded and a bf16 run of the unfused attention (ModernBERT's,
    or ``attention_backend=unfused``) dies with ModuleNotFoundError."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.albert import albert_transformer_config
    from bio_megatron.models.bert import transformer_config
    from bio_megatron.models.modernbert import modernbert_transformer_config

    build = {"megatron_bert": transformer_config, "albert": albert_transformer_config,
             "modernbert": modernbert_transformer_config}[family]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = build(ModelConfig(size="tiny", family=family), torch.bfloat16)
    built = importlib.util.find_spec("scaled_masked_softmax_cuda") is not None  # Apex's build; not on our machines
    assert cfg.bias_activation_fusion is False and cfg.masked_softmax_fusion is built
    softmax = FusedScaleMaskSoftmax(input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.padding,
                                    scaled_masked_softmax_fusion=cfg.masked_softmax_fusion, mask_func=None,
                                    softmax_in_fp32=True, scale=None)
    assert softmax.is_kernel_available(None, b=4, np=4, sq=32, sk=32) is False
