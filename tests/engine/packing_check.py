"""The packed/unpacked comparison of ``test_packing.py``, importable without pytest: the GPU check
(``tests/gpu/test_gpu_packing.py``) runs it on CUDA in a fresh process."""

from __future__ import annotations

from pathlib import Path

TINY_ROBERTA = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_roberta.yaml"
SEQ = 32
DOCS = [[5, 9, 7], [12, 3, 17]]  # document lengths per packed row: one row with padding, one full


def tiny_model(backend: str, dtype=None):
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.models.bert import build_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.parallel.distributed import init_model_parallel

    init_model_parallel(1, 1, seed=5)
    cfg = load_pretrain_config(TINY_ROBERTA, ["model.tokenizer.vocab_file=unused", "model.hidden_dropout=0",
                                              "model.attention_dropout=0", f"model.encoder_seq_length={SEQ}",
                                              f"model.attention_backend={backend}", "model.transformer_impl=local",
                                              "model.data.packing=documents"])
    model = build_model(cfg.model, 200, dtype or torch.float32)
    init_weights(model, 5, cfg.model.init_method_std, cfg.model.shape().num_layers)
    return model


def packed_vs_unpacked(backend: str, dtype=None) -> dict:
    """Losses, gradients, attention probabilities and position ids of the packed batch and its unpacked twin (the
    caller has initialised torch.distributed; on the GPU where CUDA is available)."""
    import torch

    model = tiny_model(backend, dtype)
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (len(DOCS), SEQ), generator=g)
    labels = torch.randint(5, 200, (len(DOCS), SEQ), generator=g)
    weight = torch.rand(len(DOCS), SEQ, generator=g)
    seg = torch.zeros(len(DOCS), SEQ, dtype=torch.long)
    rows = []  # (packed row, start, length) of each document
    for r, lens in enumerate(DOCS):
        at = 0
        for k, n in enumerate(lens):
            seg[r, at:at + n] = k + 1
            rows.append((r, at, n))
            at += n
    weight = weight * (seg > 0)  # the loss reads real tokens only, as the loss mask does
    un_ids = torch.ones(len(rows), SEQ, dtype=torch.long)
    un_labels, un_mask = torch.zeros_like(un_ids), torch.zeros_like(un_ids)
    un_weight = torch.zeros(len(rows), SEQ)
    for i, (r, a, n) in enumerate(rows):
        un_ids[i, :n], un_labels[i, :n], un_weight[i, :n] = ids[r, a:a + n], labels[r, a:a + n], weight[r, a:a + n]
        un_mask[i, :n] = 1

    probs, positions = [], []
    if backend == "unfused":
        for layer in model.encoder.layers:
            layer.self_attention.core_attention.attention_dropout.register_forward_hook(
                lambda mod, inp, out: probs.append(inp[0].detach().float().cpu()))
    model.embedding.position_embeddings.register_forward_hook(
        lambda mod, inp, out: positions.append(inp[0].detach().cpu()))

    def run(x, mask, lab, w):
        model.zero_grad()
        x, mask, lab, w = (t.to(dev) for t in (x, mask, lab, w))
        loss, _ = model(x, mask, tokentype_ids=torch.zeros_like(x), lm_labels=lab)
        (loss.float() * w).sum().backward()
        return loss.detach().float().cpu(), {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()
                                             if p.grad is not None}

    p_loss, p_grad = run(ids, seg, labels, weight)
    u_loss, u_grad = run(un_ids, un_mask, un_labels, un_weight)
    per_token = max(float((p_loss[r, a:a + n] - u_loss[i, :n]).abs().max()) for i, (r, a, n) in enumerate(rows))
    per_doc = [(float(p_loss[r, a:a + n].mean()), float(u_loss[i, :n].mean())) for i, (r, a, n) in enumerate(rows)]
    grad_rel = max((float((p_grad[k] - u_grad[k]).abs().max() / u_grad[k].abs().max().clamp(min=1e-12)),
                     k) for k in u_grad)
    out = {"per_token": per_token, "per_doc": per_doc, "grad_rel": grad_rel, "grads": sorted(p_grad) == sorted(u_grad),
           "positions": positions[0].tolist(), "seg": seg.tolist()}
    if probs:
        cross = seg[:, None, :, None] != seg[:, None, None, :]
        real_q = (seg > 0)[:, None, :, None].expand_as(cross)
        out["cross_max"] = max(float(p.float()[(cross & real_q).expand_as(p)].abs().max()) for p in probs[:2])
        out["row_sums"] = max(float((p.float().sum(-1)[(seg > 0)[:, None, :].expand(-1, p.shape[1], -1)] - 1)
                                    .abs().max()) for p in probs[:2])
        out["n_probs"] = len(probs)
    return out
