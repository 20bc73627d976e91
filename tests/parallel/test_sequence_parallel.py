"""Sequence parallelism (``model.sequence_parallel``) through megatron-core's: TP2 + SP trains like TP1.

The same tiny pretraining run (dropout off, several Adam steps, the real ``run_pretraining`` path) at TP1 and at
TP2 with sequence parallelism gives the same losses within 1e-5, for pre-LN and post-LN blocks: the embedding
scatters the sequence over the TP ranks, the linears all-gather / reduce-scatter it, the LM head gathers it back,
and the LayerNorms' gradients (each rank's share of the positions) are summed over TP by megatron's
``finalize_model_grads`` because their weights carry the ``sequence_parallel`` tag; an untagged LayerNorm would
update differently on each rank and the losses would part after the first step.

The collectives megatron-core's sequence parallelism runs on (``all_gather_into_tensor`` and
``reduce_scatter_tensor`` through ``tensor_parallel.mappings``) are gloo's own in the pinned torch; they are checked
here in a real 2-rank gloo world against their definitions (concatenation along dim 0; sum, then this rank's chunk),
forward and backward, in fp32 and bf16.
"""

from __future__ import annotations

import pytest
import torch
from harness import run_world

from engine.pretrain_runs import losses, overrides, pretrain_rank


def _collectives() -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import mappings

    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(2, 1, seed=3)
    rank, group = dist.get_rank(), ps.get_tensor_model_parallel_group()
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        # Every rank can build every rank's input: the definition is computed locally from all of them.
        inputs = [(torch.arange(24, dtype=torch.float32).reshape(6, 2, 2) * (r + 1) + r).to(dtype) for r in range(2)]
        x = inputs[rank].clone().requires_grad_(True)
        gathered = mappings.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=True, group=group)
        g_out = torch.full_like(gathered, float(rank + 1))  # each rank's gradient of the gathered tensor
        gathered.backward(g_out)
        # backward of a gather with tensor-parallel output grads: reduce-scatter of the ranks' gradients
        grad_def = sum(torch.full_like(gathered, float(r + 1)) for r in range(2)).chunk(2, dim=0)[rank]
        y = inputs[rank].clone().requires_grad_(True)
        scattered = mappings.reduce_scatter_to_sequence_parallel_region(y, group=group)
        scattered.backward(torch.ones_like(scattered) * (rank + 1))
        grad_scatter_def = torch.cat([torch.ones(3, 2, 2) * (r + 1) for r in range(2)]).to(dtype)
        out[str(dtype)] = {
            "gather": torch.equal(gathered.detach(), torch.cat(inputs, dim=0)),
            "gather_grad": torch.equal(x.grad, grad_def),
            "reduce_scatter": torch.equal(scattered.detach(), (inputs[0] + inputs[1]).chunk(2, dim=0)[rank]),
            "reduce_scatter_grad": torch.equal(y.grad, grad_scatter_def),
            "scatter": torch.equal(mappings.scatter_to_sequence_parallel_region(inputs[rank], group=group),
                                   inputs[rank].chunk(2, dim=0)[rank]),
        }
    return out


def test_sequence_parallel_collectives_equal_their_definitions_on_gloo():
    for rank, res in enumerate(run_world(2, _collectives)):
        for dtype, checks in res.items():
            assert all(checks.values()), (rank, dtype, checks)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("sequence_parallel")


def _pretrain_counting_sequence_scatters(over: list[str]) -> int:
    """``pretrain_rank``, returning how often megatron reduce-scattered along the sequence (0 without SP)."""
    from megatron.core.tensor_parallel import mappings

    calls, inner = [0], mappings._reduce_scatter_along_first_dim

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    mappings._reduce_scatter_along_first_dim = counted
    pretrain_rank(over)
    return calls[0]


ELECTRA = ("model.objective=electra", "model.transformer_block_type=post_ln", "model.generator_hidden_fraction=0.5",
           "model.bert_binary_head=false", "model.data.masking=token")
VARIANTS = {"pre_ln": ("model.transformer_block_type=pre_ln",), "post_ln": ("model.transformer_block_type=post_ln",),
            # BERT's next-sentence head: megatron's pooler gathers the sequence before pooling
            "pre_ln_nsp": ("model.transformer_block_type=pre_ln", "model.bert_binary_head=true"),
            "electra": ELECTRA}


@pytest.mark.parametrize("block_type", list(VARIANTS))
def test_tp2_sequence_parallel_matches_tp1(block_type, runs, pubmed_prefix):
    """ELECTRA's heads read every position: its encoders' outputs are gathered back, and the generator's input
    projection (on the rank's share of the positions) is tagged for the TP gradient sum like the LayerNorms."""
    extra = VARIANTS[block_type]
    run_world(1, pretrain_rank, overrides(pubmed_prefix, runs, f"tp1_{block_type}", steps=5, extra=extra))
    scatters = run_world(2, _pretrain_counting_sequence_scatters, overrides(
        pubmed_prefix, runs, f"sp_{block_type}", tp=2, steps=5, extra=(*extra, "model.sequence_parallel=true")))
    assert min(scatters) > 0, scatters  # sequence parallelism really ran
    ref, got = losses(runs / f"tp1_{block_type}"), losses(runs / f"sp_{block_type}")
    assert sorted(ref) == sorted(got) == [1, 2, 3, 4, 5]
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (block_type, step, got, ref)
    assert abs(ref[5] - ref[1]) > 1e-3  # the model trained: a wrong LayerNorm gradient would show from step 2


def _norms(block_type: str) -> dict:
    """Which parameters a TP2 + SP model tags for the TP all-reduce of finalize_model_grads."""
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(2, 1, seed=3)
    m = ModelConfig(size="tiny", tensor_model_parallel_size=2, sequence_parallel=True, encoder_seq_length=32,
                    max_position_embeddings=64, transformer_block_type=block_type)
    model = build_model(m, 1000)
    return {n: bool(getattr(p, "sequence_parallel", False)) for n, p in model.named_parameters()}


@pytest.mark.parametrize("block_type", ["pre_ln", "post_ln"])
def test_every_layernorm_is_tagged_for_the_tp_all_reduce(block_type):
    tags = run_world(2, _norms, block_type)[0]
    norms = [n for n in tags if "norm" in n]
    assert len(norms) >= 2 * 4 * 2 + 2 * 2  # two per layer (weight, bias), final or embedding, LM head
    assert all(tags[n] for n in norms), {n: tags[n] for n in norms}
    # ... and nothing that is split over TP or computed on the whole sequence on every rank
    assert not any(tags[n] for n in tags if "linear_qkv" in n or "linear_fc1.weight" in n or "word_embeddings" in n)


def test_sequence_parallel_is_refused_where_a_head_reads_every_position(capsys):
    """Fine-tuning heads read the whole sequence: refused with the reason, before anything is built (exit 2);
    so is TP1."""
    import logging

    from config.test_nemo_configs import NEMO, _run

    cases = [(["finetune", "ner", "--config", str(NEMO / "token_classification_config.yaml"), "--dry-run",
               "model.dataset.data_dir=/data/ncbi", "model.tensor_model_parallel_size=2"],
              "is for pretraining: the fine-tuning heads read every position"),
             (["pretrain", "--config", "nemo_configs/pretrain/tiny.yaml", "--dry-run"],
              "needs model.tensor_model_parallel_size >= 2 (got 1)")]
    for argv, expected in cases:
        rc, out, records = _run([*argv, "model.sequence_parallel=true"], capsys)
        errors = " | ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
        assert rc == 2 and out is None and expected in errors, (argv, errors)


def test_tp2_pp2_sequence_parallel_matches_tp1(runs, pubmed_prefix):
    """With pipeline parallelism the stages send each other [seq / TP, micro-batch, hidden] (megatron's schedules
    size the messages by config.sequence_parallel)."""
    run_world(1, pretrain_rank, overrides(pubmed_prefix, runs, "tp1_for_pp", steps=3))
    scatters = run_world(4, _pretrain_counting_sequence_scatters, overrides(
        pubmed_prefix, runs, "sp_pp2", tp=2, pp=2, steps=3, extra=("model.sequence_parallel=true",)))
    assert min(scatters) > 0, scatters
    ref, got = losses(runs / "tp1_for_pp"), losses(runs / "sp_pp2")
    assert sorted(ref) == sorted(got) == [1, 2, 3]
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (step, got, ref)
