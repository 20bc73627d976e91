"""``mask_padded_vocab`` fills the padded vocabulary columns in place and passes the gradient through: loss and
gradients must equal, bit for bit, those of the obvious version (clone, then slice assignment), through megatron's
vocab-parallel cross entropy, at TP1 and with TP2 vocab-parallel logits (including a rank that is all padding)."""

from __future__ import annotations

import pytest
import torch
from harness import run_world

SEQ, BATCH, HIDDEN = 6, 3, 16


def _clone_and_assign(logits: torch.Tensor, true_vocab_size: int) -> torch.Tensor:
    """The implementation before 2026-11-23 (the reference): a copy of the logits with the padding at -inf."""
    from megatron.core import parallel_state as ps

    per_rank = logits.shape[-1]
    n_real = true_vocab_size - ps.get_tensor_model_parallel_rank() * per_rank
    if n_real >= per_rank:
        return logits
    logits = logits.clone()
    logits[..., max(n_real, 0):] = float("-inf")
    return logits


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def _loss_and_grads(mask, true_vocab: int, padded: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A vocab-parallel LM head (this rank's slice of a seeded weight), the mask, megatron's cross entropy."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    rank, tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    g = torch.Generator().manual_seed(17)
    hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=g).to(dtype).requires_grad_()
    weight_full = torch.randn(padded, HIDDEN, generator=g) * 0.5
    per_rank = padded // tp
    weight = weight_full[rank * per_rank:(rank + 1) * per_rank].to(dtype).requires_grad_()
    target = torch.randint(0, true_vocab, (SEQ, BATCH), generator=g)
    loss_mask = (torch.rand(SEQ, BATCH, generator=g) < 0.6).float()
    loss_mask[0, 0] = 1.0
    logits = mask(hidden @ weight.t(), true_vocab)
    n_inf = torch.isinf(logits).sum()  # before the cross entropy, which overwrites fp32 logits in place
    losses = vocab_parallel_cross_entropy(logits.float(), target)
    loss = (losses * loss_mask).sum() / loss_mask.sum()
    loss.backward()
    return {"n_inf": n_inf, "logits": logits.detach(), "loss": loss.detach(), "hidden.grad": hidden.grad, "weight.grad": weight.grad}


def _compare(tp: int, true_vocab: int, padded: int, dtype_name: str) -> dict:
    from megatron.core import parallel_state as ps

    from bio_megatron.models.bert import mask_padded_vocab
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(tp, 1, seed=3)
    dtype = getattr(torch, dtype_name)
    ref = _loss_and_grads(_clone_and_assign, true_vocab, padded, dtype)
    new = _loss_and_grads(mask_padded_vocab, true_vocab, padded, dtype)
    filled = torch.zeros(4, 8)
    out = mask_padded_vocab(filled, 5 + 8 * ps.get_tensor_model_parallel_rank())  # 5 real columns on each rank
    return {"differ": [k for k in ref if not torch.equal(_bits(ref[k]), _bits(new[k]))],
            "n_inf": int(ref["n_inf"]), "in_place": out.data_ptr() == filled.data_ptr(),
            "filled": bool(torch.isinf(filled[:, 5:]).all() and torch.isfinite(filled[:, :5]).all()),
            "grad_dtype": str(new["weight.grad"].dtype)}


@pytest.mark.parametrize("tp, true_vocab, padded, dtype", [
    (1, 1000, 1024, "float32"),
    (1, 1000, 1024, "bfloat16"),
    (2, 1000, 1024, "float32"),  # rank 1 holds the 24 padded columns
    (2, 500, 1024, "float16"),   # rank 0 holds 12 padded columns, rank 1 is all padding
], ids=["tp1-fp32", "tp1-bf16", "tp2-fp32", "tp2-all-padding-rank-fp16"])
def test_in_place_mask_is_bit_identical_to_clone(tp, true_vocab, padded, dtype):
    results = run_world(tp, _compare, tp, true_vocab, padded, dtype)
    for rank, res in enumerate(results):
        assert res["differ"] == [], (rank, res)
        assert res["in_place"] and res["filled"], (rank, res)
        assert res["grad_dtype"] == f"torch.{dtype}"
    # the padding was really there to mask
    assert sum(r["n_inf"] for r in results) == SEQ * BATCH * (padded - true_vocab)
