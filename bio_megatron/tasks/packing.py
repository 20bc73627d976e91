"""Packed fine-tuning batches (``model.dataset.packing: true``, NER and classification): the examples of a
micro-batch share rows instead of each padding its own.

A micro-batch keeps its examples (the same ones, in the same order, with the same loss); only the encoder's input
changes: the examples are packed greedily into rows of the micro-batch's length, each attending only to itself
with positions restarting (``TaskModel.forward(..., unpack=)``), and the encoder's states are laid back out per
example before the head. The head, ``Task.loss`` and ``Task.outputs`` therefore see exactly the unpacked
micro-batch: per-token logits for NER, each example's own [CLS] for classification. The batch carries the task's
own (unpacked) keys plus the packed inputs under ``packed_*`` and ``unpack``.
"""

from __future__ import annotations

import numpy as np
import torch

from bio_megatron.data.packing import pack_segments

PACKABLE = ("ner", "classify")
"""Tasks whose ``collate`` gives one sequence per example (RE's markers and QA's document strides are not packed)."""


def pack(batch: dict[str, torch.Tensor], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """``batch`` (a task's ``collate``: ``input_ids``, ``attention_mask``, ``tokentype_ids`` ``[n, L]``) with its
    examples packed into rows of ``seq_len``: ``packed_input_ids`` / ``packed_tokentype_ids`` ``[rows, seq_len]``,
    ``packed_segments`` (1, 2, ... per example, 0 = padding) and ``unpack`` ``[n, L]`` (see ``unpack_rows``)."""
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["tokentype_ids"]
    n, width = ids.shape
    lengths = mask.sum(-1).to(torch.long)
    rows = pack_segments(np.asarray(lengths.tolist(), dtype=np.int64), seq_len)
    p_ids = torch.full((len(rows), seq_len), pad_id, dtype=ids.dtype)
    p_types, seg = torch.zeros_like(p_ids), torch.zeros_like(p_ids)
    unpack = torch.full((n, width), -1, dtype=torch.long)
    for r, (first, end) in enumerate(rows.tolist()):
        at = 0
        for k, e in enumerate(range(first, end)):
            L = int(lengths[e])
            p_ids[r, at:at + L], p_types[r, at:at + L] = ids[e, :L], types[e, :L]
            seg[r, at:at + L] = k + 1
            unpack[e, :L] = torch.arange(r * seq_len + at, r * seq_len + at + L)
            at += L
    return {**batch, "packed_input_ids": p_ids, "packed_tokentype_ids": p_types, "packed_segments": seg,
            "unpack": unpack}


def model_inputs(b: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
    """The encoder's arguments for a batch, packed or not: ``model(*args, **kwargs)``."""
    if "unpack" in b:
        return (b["packed_input_ids"], b["packed_segments"], b["packed_tokentype_ids"]), {"unpack": b["unpack"]}
    return (b["input_ids"], b["attention_mask"], b["tokentype_ids"]), {}
