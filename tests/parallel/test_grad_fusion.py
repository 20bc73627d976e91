"""Gradient-accumulation fusion (``bio_megatron/parallel/grad_fusion.py``) against megatron's unfused path.

Two copies of the same seeded model in one world, one with ``model.gradient_accumulation_fusion=true`` (weight
gradients written into DDP's buffer by the linears' and the word embedding's backward), one with ``false``
(megatron's default without apex: a fresh gradient per weight, added in by DDP's hook), run the same batches;
their gradient buffers are compared parameter by parameter after a second step (which finds the first one's
gradients in the buffer: the fused side zeroes it lazily). With one micro-batch in fp32 they must hold the same
values (an exact zero may differ in sign), except the word-embedding rows of tokens that occur more than once (the fused path adds each occurrence
into the buffer, the unfused one sums them first). Also: the fused paths really ran (``grad_added_to_main_grad``),
two micro-batches at PP2, TP2 (vocab-parallel embedding with masked rows), bf16 and ELECTRA's three-way tied
embedding (generator input, discriminator input, generator LM head)."""

from __future__ import annotations

import pytest
import torch
from harness import run_world

VOCAB, SEQ, MICRO = 1000, 16, 2


def _batch(i: int, electra: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    text = torch.randint(5, 60, (MICRO, SEQ), generator=g)  # a small id range: many repeated tokens
    text[:, 0] = 999  # a token of the last TP2 shard, once per sequence
    b = {"text": text, "types": torch.zeros(MICRO, SEQ, dtype=torch.long),
         "labels": torch.randint(5, VOCAB, (MICRO, SEQ), generator=g),
         "loss_mask": (torch.rand(MICRO, SEQ, generator=g) < 0.3).long(),
         "padding_mask": torch.ones(MICRO, SEQ, dtype=torch.long)}
    b["padding_mask"][1, -3:] = 0
    if electra:
        b["sample_index"] = torch.arange(i * MICRO, (i + 1) * MICRO)
    return b


def _grads(tp: int, pp: int, dtype_name: str, objective: str, microbatches: int, exact: bool) -> dict:
    from functools import partial

    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import layers

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.pretrain import build_stage, electra_forward_step, forward_step

    init_distributed()
    init_model_parallel(tp, pp, seed=7)
    dtype, electra = getattr(torch, dtype_name), objective == "electra"
    out: dict = {}
    for fusion in (False, True):
        cfg = PretrainConfig()
        cfg.trainer.seed = 1234
        cfg.model = ModelConfig(size="tiny", encoder_seq_length=SEQ, max_position_embeddings=64, micro_batch_size=MICRO,
                                global_batch_size=MICRO * microbatches, tensor_model_parallel_size=tp,
                                pipeline_model_parallel_size=pp, objective=objective, hidden_dropout=0.0,
                                attention_dropout=0.0, gradient_accumulation_fusion=fusion,
                                transformer_block_type="post_ln" if electra else "pre_ln")
        model, ddp = build_stage(cfg, VOCAB, dtype)
        step = (partial(electra_forward_step, seed=1234, weight=50.0) if electra
                else partial(forward_step, binary_head=False))
        for first in (0, microbatches):  # two steps: the second finds the first one's gradients in the buffer
            ddp.zero_grad_buffer()
            get_forward_backward_func()(forward_step_func=step, data_iterator=iter([
                _batch(first + i, electra) for i in range(microbatches)]), model=[ddp], num_microbatches=microbatches,
                seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        out[fusion] = {n: p.main_grad.detach().clone() for n, p in model.named_parameters()}
        linears = [m for m in model.modules() if isinstance(m, (layers.ColumnParallelLinear, layers.RowParallelLinear))]
        weights = [m.weight for m in model.modules() if isinstance(m, layers.VocabParallelEmbedding)]
        weights += [m.weight for m in linears if m.weight is not None]
        out[f"fused_ran_{fusion}"] = {
            "linears": all(m.gradient_accumulation_fusion for m in linears) and bool(linears),
            "flags": sorted({bool(getattr(w, "grad_added_to_main_grad", False)) for w in weights})}
        # A step in which no gradient arrives: whatever reads the buffer must find zeros, not the last step's.
        ddp.zero_grad_buffer()
        ddp.finish_grad_sync()
        out[f"stale_{fusion}"] = sorted(n for n, p in model.named_parameters() if p.main_grad.abs().sum() > 0)
    from megatron.core import parallel_state as ps

    ids = torch.cat([_batch(microbatches + i, electra)["text"].reshape(-1) for i in range(microbatches)])
    counts = torch.bincount(ids, minlength=4 * VOCAB)  # covers the padded vocabulary of every TP rank
    return {"ran": out["fused_ran_True"], "ran_off": out["fused_ran_False"], "stale": out["stale_True"],
            "differences": _differences(out[False], out[True], counts, ps.get_tensor_model_parallel_rank(),
                                        dtype_name, exact)}


def _differences(ref: dict, new: dict, counts: torch.Tensor, tp_rank: int, dtype: str, exact: bool) -> list[str]:
    """What differs between the unfused (``ref``) and fused (``new``) gradient buffers beyond what is allowed."""
    problems = [] if ref.keys() == new.keys() else [f"parameters differ: {sorted(ref.keys() ^ new.keys())}"]
    for name in ref.keys() & new.keys():
        r, f = ref[name], new[name]
        if not r.abs().sum() > 0:
            problems.append(f"{name}: no gradient, the comparison would prove nothing")
        if exact:
            keep = torch.ones(r.shape[0], dtype=torch.bool)
            if name.endswith("word_embeddings.weight"):  # rows of tokens seen at most once: the same additions
                keep = counts[tp_rank * r.shape[0]:(tp_rank + 1) * r.shape[0]] <= 1
            if not torch.equal(r[keep], f[keep]):  # values: an overwrite keeps -0.0 where 0.0 + -0.0 gives +0.0
                problems.append(f"{name}: not identical, max |diff| {(r - f).abs().max().item():.3g}")
        # bf16: the embedding's repeated rows are summed in fp32 now, not in bf16 (half a bf16 ulp is 2e-3)
        tol = 4e-3 if dtype == "bfloat16" and "word_embeddings" in name else 1e-6
        if not torch.allclose(f, r, rtol=tol, atol=tol * r.abs().max().item()):
            problems.append(f"{name}: max |diff| {(r - f).abs().max().item():.3g} beyond {tol}")
    return problems


CASES = [  # tp, pp, dtype, objective, micro-batches, bit-identical outside repeated embedding rows
    (1, 1, "float32", "bert", 1, True),
    (2, 1, "float32", "bert", 1, True),
    (1, 2, "float32", "bert", 2, False),
    (1, 1, "bfloat16", "bert", 1, False),
    (1, 1, "bfloat16", "bert", 2, False),  # the second micro-batch adds a bf16 GEMM into the fp32 buffer
    (1, 1, "float32", "electra", 1, False),
]


@pytest.mark.parametrize("tp, pp, dtype, objective, microbatches, exact", CASES,
                         ids=["tp1-fp32", "tp2-fp32", "pp2-2micro-fp32", "tp1-bf16", "tp1-2micro-bf16", "electra-fp32"])
def test_fused_gradients_equal_megatrons_unfused(tp, pp, dtype, objective, microbatches, exact):
    for rank, res in enumerate(run_world(tp * pp, _grads, tp, pp, dtype, objective, microbatches, exact)):
        assert res["ran"]["linears"] and res["ran"]["flags"] == [True], (rank, res["ran"])
        assert res["ran_off"]["flags"] == [False], (rank, res["ran_off"])
        assert res["differences"] == [], (rank, res["differences"])
        assert res["stale"] == [], (rank, "gradients left from the last step", res["stale"])


def test_converting_add_in_row_blocks_equals_add():
    """The bf16 -> fp32 accumulation runs in row blocks (a small reused temporary instead of one as large as the
    weight): element for element the same sums as one ``add_``, also for a 1-D tensor and a ragged last block."""
    from bio_megatron.parallel import grad_fusion

    g = torch.Generator().manual_seed(5)
    for shape in [(3001, 1000), (70, 3), (5_000_000,)]:
        dst = torch.randn(shape, generator=g)
        src = torch.randn(shape, generator=g).bfloat16()
        expected = dst.clone().add_(src)
        grad_fusion._add_converted(dst, src)
        assert torch.equal(dst, expected), shape
