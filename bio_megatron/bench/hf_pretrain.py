"""The Hugging Face side of ``bench pretrain``: ``MegatronBertFor{MaskedLM,PreTraining}`` of the benchmark's shape,
started from our model's initial weights, with SDPA in place of its eager attention (``--hf-attention sdpa``), and one
train step as the HF Trainer runs it (autocast, backward, clipping, AdamW). ``bench/pretrain.py`` steps it in its own
process on the CPU (``bench/hf_process.py``), in the same one on a GPU."""

from __future__ import annotations

import argparse
import types
from typing import TYPE_CHECKING

from bio_megatron.bench.pretrain_common import SEED, bench_device, optimizer_impl, synthetic_batch
from bio_megatron.bench.timing import Laps, Step

if TYPE_CHECKING:
    import torch


def _sdpa_self_attention(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                         past_key_values=None, output_attentions=False, **kwargs):
    """``MegatronBertSelfAttention.forward`` on ``F.scaled_dot_product_attention`` (encoder self-attention)."""
    import torch.nn.functional as F

    if encoder_hidden_states is not None or past_key_values is not None:
        raise ValueError("the SDPA benchmark patch covers encoder self-attention only")
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    q, k, v = (lin(hidden_states).view(shape).transpose(1, 2) for lin in (self.query, self.key, self.value))
    if attention_mask is not None and attention_mask.dtype.is_floating_point:
        attention_mask = attention_mask.to(q.dtype)  # HF builds the additive mask in fp32; SDPA wants q's dtype
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask,
                                         dropout_p=self.dropout.p if self.training else 0.0)
    return ctx.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.all_head_size), None


def use_sdpa_attention(model: "torch.nn.Module") -> int:
    """Route every HF MegatronBert self-attention through SDPA; returns how many modules were patched."""
    from transformers.models.megatron_bert.modeling_megatron_bert import MegatronBertSelfAttention

    n = 0
    for module in model.modules():
        if isinstance(module, MegatronBertSelfAttention):
            module.forward = types.MethodType(_sdpa_self_attention, module)
            n += 1
    return n


def build_hf_model(args: argparse.Namespace, device: "torch.device", weights: dict | None = None) -> "torch.nn.Module":
    """HF ``MegatronBertFor{MaskedLM,PreTraining}`` of the benchmark shape, in fp32, on ``device``; with ``weights``
    (HF keys, e.g. ``mcore_to_hf`` of our model) it starts from them instead of its own random init."""
    import torch
    from transformers import MegatronBertForMaskedLM, MegatronBertForPreTraining

    from bio_megatron.config.sizes import SIZES
    from bio_megatron.models.hf_convert import hf_config

    cfg = hf_config(SIZES[args.size], args.vocab_size, max(512, args.seq), attn_implementation="eager")
    torch.manual_seed(SEED)
    with device:  # allocate (and initialise) directly on the device
        model = (MegatronBertForPreTraining if args.binary_head else MegatronBertForMaskedLM)(cfg)
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        params = dict(model.named_parameters())  # the tied decoder weight is the word embedding: not "missing"
        missing = [k for k in missing if k in params and k != "cls.predictions.decoder.weight"]
        if missing or unexpected:
            raise RuntimeError(f"HF baseline weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if args.hf_attention == "sdpa":
        use_sdpa_attention(model)
    return model


def hf_step(args: argparse.Namespace, dtype: "torch.dtype", weights: dict | None = None) -> tuple[Step, str]:
    """A train step of the HF baseline (autocast forward, backward, clip to 1.0, AdamW), and its optimizer."""
    import torch

    device = bench_device()
    model = build_hf_model(args, device, weights).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01, fused=args.hf_optimizer == "fused")
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    b = {k: v.to(device) for k, v in synthetic_batch(args.vocab_size, args.micro_batch, args.seq,
                                                     args.binary_head).items() if v is not None}
    inputs = {"input_ids": b["text"], "attention_mask": b["padding_mask"], "token_type_ids": b["types"],
              "labels": torch.where(b["loss_mask"].bool(), b["labels"], -100)}
    if args.binary_head:
        inputs["next_sentence_label"] = b["is_random"]

    def step() -> dict[str, float]:
        lap = Laps()
        opt.zero_grad(set_to_none=True)
        lap("other")
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**inputs).loss
        scaler.scale(loss).backward()
        lap("forward_backward")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        lap("optimizer")
        return lap.parts

    return step, optimizer_impl(opt)
