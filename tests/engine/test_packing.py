"""Packed pretraining rows (``model.data.packing: documents``): several documents per row, none attending to another.

- The rows: every segment is one document's full sentences, ``<s> ... </s>``, numbered 1, 2, ... in
  ``padding_mask``; rows cover every sentence once and fill greedily.
- The model (fp32, dropout off, the unfused megatron attention and SDPA on CPU): per-token and per-document losses
  and every parameter gradient of a packed batch equal the same documents each alone in a padded row; megatron's
  ``DotProductAttention`` probabilities are exactly 0 across documents; position ids restart per document.
- Whole runs through the real pretraining path: TP2 = TP1 packed, resume exact, and the refusals at config time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from architectures.test_roberta_data import (TINY_ROBERTA, _roberta, _roberta_rank, bpe_dir,  # noqa: F401
                                             bpe_prefix, tokenizer)
from harness import run_world

from engine.packing_check import DOCS, SEQ, packed_vs_unpacked
from engine.pretrain_runs import losses
from reliability.cli_log import run_cli

pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")  # IndexedDataset outside a world

PACKED = ("model.data.packing=documents",)
CONST = ("model.optim.sched.name=constant", "model.optim.sched.warmup_steps=1",
         "model.optim.sched.warmup_ratio=null", "model.optim.sched.min_lr=0")


def _packed_dataset(prefix: Path, tokenizer, seq: int, num_samples: int = 0):  # noqa: F811
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from bio_megatron.data.roberta import RobertaDataset

    indexed = IndexedDataset(str(prefix))
    return RobertaDataset(indexed, (0, len(indexed.document_indices) - 1), num_samples, seq, tokenizer,
                          0.15, 1234, "train", packing="documents")


@pytest.mark.parametrize("seq", [64, 512])
def test_rows_pack_whole_documents(bpe_prefix, tokenizer, seq):  # noqa: F811
    """Each segment: <s> + consecutive sentences of ONE document + </s>, numbered 1, 2, ... in padding_mask; all
    sentences once, in order; rows within the length and greedy (the next segment would not have fitted)."""
    ds = _packed_dataset(bpe_prefix, tokenizer, seq, num_samples=1)
    indexed = ds.indexed
    doc_of = np.searchsorted(np.asarray(indexed.document_indices), np.arange(len(indexed)), side="right") - 1
    lengths = np.asarray(indexed.sequence_lengths)
    covered, per_row = [], []
    for b, (first, end) in enumerate(ds.blocks.tolist()):
        parts = ds.parts(b)
        per_row.append(len(parts))
        assert sum(len(p) for p in parts) <= seq
        for p, (a, z) in zip(parts, ds.segments[first:end].tolist()):
            sents = [s for s in range(a, z) if lengths[s] > 0]
            assert len(set(doc_of[sents].tolist())) == 1  # never two documents in one segment
            body = np.concatenate([indexed[s] for s in sents])[:seq - 2]
            assert p.tolist() == [tokenizer.cls, *body.tolist(), tokenizer.sep]
            covered += sents
        if b + 1 < len(ds.blocks):
            nxt = ds.parts(b + 1)[0]
            assert sum(len(p) for p in parts) + len(nxt) > seq  # greedy
    assert covered == [s for s in range(len(lengths)) if lengths[s] > 0]
    sample = ds[0]
    parts = ds.parts(ds._block_of(0)[0])
    expected = np.concatenate([np.full(len(p), k + 1) for k, p in enumerate(parts)])
    assert sample["padding_mask"][:len(expected)].tolist() == expected.tolist()
    assert not sample["padding_mask"][len(expected):].any()
    assert (sample["text"][len(expected):] == tokenizer.pad).all()
    if seq == 512:  # abstracts share rows (84 documents, PMC's long ones split into full-sentence segments)
        assert sum(n > 1 for n in per_row) >= 10, per_row


def _packed_vs_unpacked(backend: str) -> dict:
    from bio_megatron.parallel.distributed import init_distributed

    init_distributed()
    return packed_vs_unpacked(backend)


@pytest.fixture(scope="module", params=["unfused", "sdpa"])
def packed_run(request) -> tuple[str, dict]:
    return request.param, run_world(1, _packed_vs_unpacked, request.param)[0]


def test_packed_losses_and_gradients_equal_unpacked(packed_run):
    backend, r = packed_run
    print(f"{backend}: max |per-token loss diff| {r['per_token']:.2e}, max relative gradient diff "
          f"{r['grad_rel'][0]:.2e} ({r['grad_rel'][1]})")
    assert r["grads"]
    assert r["per_token"] < 1e-5, r["per_token"]
    for packed, alone in r["per_doc"]:
        assert packed == pytest.approx(alone, abs=1e-5)
    assert r["grad_rel"][0] < 1e-4, r["grad_rel"]


def test_no_attention_weight_crosses_a_document(packed_run):
    backend, r = packed_run
    if backend != "unfused":
        pytest.skip("SDPA computes its probabilities inside the kernel; its equality to unpacked is the check")
    assert r["n_probs"] >= 2  # the hook saw megatron's probabilities in every layer of both forwards
    assert r["cross_max"] == 0.0  # masked before the softmax: exactly zero, not small
    assert r["row_sums"] < 1e-5  # each real token's weights sum to 1 over its own document


def test_position_ids_restart_per_document(packed_run):
    _, r = packed_run
    for seg_row, pos_row in zip(r["seg"], r["positions"]):
        at = 0
        for n in [len([s for s in seg_row if s == k]) for k in range(1, max(seg_row) + 1)]:
            assert pos_row[at:at + n] == list(range(n))
            at += n


def test_position_ids_and_mask_helpers():
    import torch

    from bio_megatron.models.attention import is_packed, packed_attention_mask, packed_position_ids

    seg = torch.tensor([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
    assert packed_position_ids(seg).tolist() == [[0, 1, 0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 0, 1, 2]]
    mask = packed_attention_mask(seg)
    assert mask.shape == (2, 1, 8, 8) and not mask[0, 0, 2, 4] and mask[0, 0, 1, 2] and mask[0, 0, 5, 6]
    assert not mask.all(-1).any()  # no query row entirely masked (SDPA would give NaN)
    assert is_packed(seg) and not is_packed(seg.clamp(max=1)) and not is_packed(seg.bool())


@pytest.fixture(scope="module")
def runs(bpe_prefix, bpe_dir, tmp_path_factory):  # noqa: F811
    """One packed TP1 run of 4 steps, the same at TP2, and a TP1 run stopped at step 2 and resumed to 4."""
    root = tmp_path_factory.mktemp("packed_runs")
    fast = (*PACKED, *CONST, "model.encoder_seq_length=128", "model.max_position_embeddings=128")
    run_world(1, _roberta_rank, _roberta(bpe_prefix, bpe_dir, root, "tp1", steps=4, fast=fast))
    run_world(2, _roberta_rank, _roberta(bpe_prefix, bpe_dir, root, "tp2", tp=2, steps=4, fast=fast))
    run_world(1, _roberta_rank, _roberta(bpe_prefix, bpe_dir, root, "split", steps=2, fast=fast, save_last=True))
    run_world(1, _roberta_rank, _roberta(bpe_prefix, bpe_dir, root, "split", steps=4, fast=fast))
    return {name: losses(root / name) for name in ("tp1", "tp2", "split")}


def test_packed_tp2_equals_tp1(runs):
    tp1, tp2 = runs["tp1"], runs["tp2"]
    assert sorted(tp1) == sorted(tp2) == [1, 2, 3, 4]
    worst = max(abs(tp1[s] - tp2[s]) for s in tp1)
    print(f"packed TP2 vs TP1 max |loss diff| {worst:.2e}")
    assert worst < 1e-5, worst


def test_packed_resume_is_exact(runs):
    whole, split = runs["tp1"], runs["split"]
    assert sorted(split) == [1, 2, 3, 4]
    assert [split[s] for s in (3, 4)] == [whole[s] for s in (3, 4)]


@pytest.mark.parametrize("extra, message", [
    (("model.objective=bert",), r"model.data.packing \(documents\) packs RoBERTa's rows: it needs model.objective "
                                r"mlm \(got bert\); megatron-core.s BERT samples already hold one document each"),
    (("model.transformer_block_type=pre_ln", "model.transformer_impl=transformer_engine"),
     r"model.data.packing \(documents\) needs model.transformer_impl local or auto"),
])
def test_packing_refused_where_it_cannot_run(bpe_prefix, bpe_dir, tmp_path, extra, message):  # noqa: F811
    import re

    over = _roberta(bpe_prefix, bpe_dir, tmp_path, "refused", fast=(*PACKED, *extra))
    rc, text = run_cli(["pretrain", "--config", str(TINY_ROBERTA), *over])
    assert rc == 2 and re.search(message, text), text
    assert not (tmp_path / "refused").exists()  # refused at config time: no run folder


@pytest.mark.parametrize("family", ["albert"])
def test_packing_refused_for_families_building_their_own_masks(family):
    from bio_megatron.config.packing import finetune_packing_problems, packing_problems
    from bio_megatron.config.pretrain import ModelConfig

    m = ModelConfig(objective="mlm", family=family)
    m.data.packing = "documents"
    assert [p for p in packing_problems(m) if f"not model.family {family}" in p]
    assert [p for p in finetune_packing_problems(m, True) if f"not model.family {family}" in p]
    assert not packing_problems(ModelConfig(objective="mlm", family="roberta"))  # packing null: nothing to check
