"""Packing whole documents into pretraining rows without attention across them (``model.data.packing: documents``).

Encoder trainers that pack (ModernBERT, MosaicBERT, NVIDIA BioNeMo; Megatron-LM's ``--reset-attention-mask`` and
``--reset-position-ids`` for GPT) fill each row with several documents and let each attend only to itself, with
position ids restarting at every document. A row is then the same computation as its documents each alone in a
padded row, with no padding spent: the packed/unpacked equality that ``tests/engine/test_packing.py`` checks.

A packed row says where its documents are through its ``padding_mask``: instead of 1 (token) / 0 (padding) it holds
the segment number, 1, 2, ... for the row's first, second, ... document and 0 for padding. A row of one document is
then exactly today's padding mask, and the model (``models/bert.py::BioBertModel``) turns segment numbers into a
block-diagonal attention mask and restarting position ids (``models/attention.py``).

What a segment is: the consecutive full sentences of one document that fit ``seq_length - 2`` tokens (a longer
document becomes several segments, fairseq's ``complete_doc`` break mode), rendered ``<s> ... </s>``. Segments are
packed greedily in corpus order, so the rows are a pure function of the data and the sequence length.
"""

from __future__ import annotations

import numpy as np

PACKING_MODES = (None, "documents")
"""``model.data.packing``: None = the objective's own rows (BERT: one sample per row; RoBERTa: FULL-SENTENCES
across documents, attending to each other as fairseq does); documents = whole documents per row, no attention
across them."""


def document_segments(sentence_lengths: np.ndarray, doc_starts: np.ndarray, budget: int) -> np.ndarray:
    """``[n_segments, 2]`` (first sentence, end sentence): consecutive full sentences of ONE document that fit
    ``budget`` tokens. A segment never crosses a document start; a single sentence over ``budget`` is a segment of
    its own (its tokens are cut when rendered). Empty sentences are skipped (no segment starts with one)."""
    segments: list[tuple[int, int]] = []
    first, used = -1, 0
    for i, n in enumerate(sentence_lengths.tolist()):
        if first >= 0 and (doc_starts[i] or (n > 0 and used + n > budget)):
            segments.append((first, i))
            first, used = -1, 0
        if n == 0:
            continue
        if first < 0:
            first = i
        used += n
    if first >= 0:
        segments.append((first, len(sentence_lengths)))
    return np.asarray(segments, dtype=np.int64).reshape(-1, 2)


def pack_segments(segment_tokens: np.ndarray, seq_length: int) -> np.ndarray:
    """``[n_rows, 2]`` (first segment, end segment): consecutive segments of ``segment_tokens`` tokens each
    (their special tokens included, each at most ``seq_length``) packed greedily in order into rows of at most
    ``seq_length`` tokens."""
    rows: list[tuple[int, int]] = []
    first, used = 0, 0
    for i, n in enumerate(segment_tokens.tolist()):
        if i > first and used + n > seq_length:
            rows.append((first, i))
            first, used = i, 0
        used += n
    if len(segment_tokens) > first:
        rows.append((first, len(segment_tokens)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def segment_ids(lengths: list[int], seq_length: int) -> np.ndarray:
    """The ``padding_mask`` of a row holding segments of ``lengths`` tokens: 1, 2, ... per segment, 0 after."""
    out = np.zeros(seq_length, dtype=np.int64)
    out[:sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int64), lengths)
    return out
