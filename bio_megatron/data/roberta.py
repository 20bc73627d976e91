"""RoBERTa's pretraining samples (``model.objective: mlm``): FULL-SENTENCES packing and dynamic masking.

As RoBERTa (Liu et al. 2019, section 4.2) and bio-lm train it, over megatron-core's ``IndexedDataset``
(one sequence per sentence, documents from ``document_indices``, as ``bio-megatron data tokenize`` writes):

- **Packing**: consecutive full sentences, crossing document boundaries, up to the sequence length:
  ``<s> s1 s2 </s> s3 ... </s>`` with ``</s>`` between documents. A sentence never straddles two samples;
  one that alone exceeds the limit is truncated. Blocks are fixed once per split; their order is reshuffled
  every epoch.
- **Dynamic masking**: the mask of global sample ``i`` is drawn from ``(seed, split, block, epoch)``, so a block
  seen again in a later epoch gets a new mask, while the sample at a given index (hence at a given global
  step) is always the same: resuming at step ``s`` needs nothing but ``s``.
- **Masking**: 15 % of the real (non-special) tokens, count rounded stochastically as fairseq's
  ``MaskTokensDataset``; of those 80 % ``<mask>``, 10 % a random non-special token, 10 % unchanged.
- **Padding**: ``<pad>`` may have any id (1 in RoBERTa): the padding and loss masks come from the sample.
- **Packing documents** (``model.data.packing: documents``, :mod:`bio_megatron.data.packing`): instead, each row
  holds whole documents (or full-sentence chunks of a long one), each ``<s> ... </s>``, attending only to itself;
  ``padding_mask`` numbers them 1, 2, ... Masking is drawn the same way over the row.

Samples carry the keys of megatron-core's BERT dataset (``text``, ``types`` all 0, ``labels`` -1 where not
predicted, ``loss_mask``, ``padding_mask``, ``is_random`` 0), so the pretraining ``forward_step`` is shared.
"""

from __future__ import annotations

import numpy as np

from bio_megatron.data.packing import document_segments, pack_segments, segment_ids
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def document_split(n_docs: int, splits_string: str) -> list[tuple[int, int] | None]:
    """``[(first_doc, end_doc) or None]`` for train / valid / test, exactly as megatron-core splits documents."""
    from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                        parse_and_normalize_split)

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(splits_string))
    out: list[tuple[int, int] | None] = []
    for bookends in matrix:
        if bookends is None:
            out.append(None)
            continue
        beg, end = int(round(bookends[0] * n_docs)), int(round(bookends[1] * n_docs))
        out.append((beg, end) if end > beg else None)
    return out


def pack_full_sentences(sentence_lengths: np.ndarray, doc_starts: np.ndarray, budget: int) -> np.ndarray:
    """Greedy FULL-SENTENCES packing: ``[n_blocks, 2]`` (first sentence, end sentence) per block.

    ``doc_starts`` marks the sentences that open a document; each such sentence inside a block costs one
    extra ``</s>``. ``budget`` is the sequence length minus ``<s>`` and the closing ``</s>``. Empty sentences
    are skipped (a block never starts with one).
    """
    blocks: list[tuple[int, int]] = []
    first, used = -1, 0
    for i, n in enumerate(sentence_lengths.tolist()):
        if n == 0:
            continue
        cost = n + (1 if first >= 0 and doc_starts[i] else 0)
        if first >= 0 and used + cost > budget:
            blocks.append((first, i))
            first, used = -1, 0
            cost = n
        if first < 0:
            first = i
        used += cost
    if first >= 0:
        blocks.append((first, len(sentence_lengths)))
    return np.asarray(blocks, dtype=np.int64).reshape(-1, 2)


class RobertaDataset:
    """``num_samples`` packed, dynamically masked samples over documents ``[doc_begin, doc_end)`` of ``indexed``."""

    def __init__(self, indexed, doc_range: tuple[int, int], num_samples: int, seq_length: int, tokenizer,
                 masking_probability: float, seed: int, name: str, packing: str | None = None):
        self.indexed, self.seq_length, self.seed, self.name = indexed, seq_length, seed, name
        self.packing = packing
        self.stream = 0 if name == "train" else 1  # train and valid draw from different random streams
        self.masking_probability = masking_probability
        self.cls, self.sep, self.pad, self.mask = tokenizer.cls, tokenizer.sep, tokenizer.pad, tokenizer.mask
        self.special = np.array(sorted({self.cls, self.sep, self.pad, self.mask, tokenizer.unk}), dtype=np.int64)
        # Random replacements come from the real vocabulary only, never a special token (as fairseq's weights).
        self.replacements = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int64), self.special)
        doc_idx = np.asarray(indexed.document_indices, dtype=np.int64)
        s_beg, s_end = int(doc_idx[doc_range[0]]), int(doc_idx[doc_range[1]])
        lengths = np.asarray(indexed.sequence_lengths[s_beg:s_end], dtype=np.int64)
        doc_starts = np.zeros(s_end - s_beg, dtype=bool)
        doc_starts[doc_idx[doc_range[0]:doc_range[1]] - s_beg] = True
        self.doc_starts = doc_starts
        self.first_sentence = s_beg
        if packing == "documents":
            # Rows of segments (each one document's full sentences, <s> ... </s>); blocks index self.segments.
            self.segments = document_segments(lengths, doc_starts, seq_length - 2) + s_beg
            seg_tokens = np.array([min(int(lengths[a - s_beg:b - s_beg].sum()), seq_length - 2) + 2
                                   for a, b in self.segments], dtype=np.int64)
            self.blocks = pack_segments(seg_tokens, seq_length)
            log.info("%s: %d whole-document segments packed into %d rows of %d (%.1f%% of the tokens real; one "
                     "segment per row: %.1f%%)", name, len(seg_tokens), len(self.blocks), seq_length,
                     100 * seg_tokens.sum() / (len(self.blocks) * seq_length),
                     100 * seg_tokens.sum() / max(1, len(seg_tokens) * seq_length))
        else:
            self.blocks = pack_full_sentences(lengths, doc_starts, seq_length - 2) + s_beg
        if len(self.blocks) == 0:
            raise DataError(f"the {name} split (documents {doc_range[0]}..{doc_range[1] - 1}) holds no tokens")
        self.num_samples = max(int(num_samples), len(self.blocks))
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)
        log.info("%s: %d documents -> %d packed sequences of <= %d tokens; %d samples (%.2f epochs)", name,
                 doc_range[1] - doc_range[0], len(self.blocks), seq_length, self.num_samples,
                 self.num_samples / len(self.blocks))

    def __len__(self) -> int:
        return self.num_samples

    def _block_of(self, idx: int) -> tuple[int, int]:
        """(block, epoch) of global sample ``idx``: each epoch visits every block once, in its own order."""
        epoch, pos = divmod(idx, len(self.blocks))
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, self.stream, epoch]).permutation(len(self.blocks))
            self._epoch = epoch
        return int(self._order[pos]), epoch

    def tokens(self, block: int) -> np.ndarray:
        """The unmasked ``<s> ... </s>`` sequence of ``block`` (no padding)."""
        return np.concatenate(self.parts(block))

    def parts(self, block: int) -> list[np.ndarray]:
        """The unmasked sequences ``<s> ... </s>`` a row holds: one (FULL-SENTENCES), or one per packed segment."""
        if self.packing == "documents":
            first, end = (int(x) for x in self.blocks[block])
            return [self._render(*(int(x) for x in self.segments[i])) for i in range(first, end)]
        return [self._render(*(int(x) for x in self.blocks[block]))]

    def _render(self, first: int, end: int) -> np.ndarray:
        """``<s>`` sentences ``[first, end)`` ``</s>``, with ``</s>`` between documents (only FULL-SENTENCES has
        several documents in one part)."""
        parts = [np.array([self.cls], dtype=np.int64)]
        budget = self.seq_length - 2
        for s in range(first, end):
            ids = np.asarray(self.indexed[s], dtype=np.int64)
            if len(ids) == 0:
                continue
            if s > first and self.doc_starts[s - self.first_sentence]:
                parts.append(np.array([self.sep], dtype=np.int64))
            parts.append(ids[:budget])  # only a block's single over-long sentence is ever cut
        parts.append(np.array([self.sep], dtype=np.int64))
        return np.concatenate(parts)

    def __getitem__(self, idx: int) -> dict[str, np.ndarray | int]:
        block, epoch = self._block_of(int(idx))
        parts = self.parts(block)
        tokens = np.concatenate(parts)
        rng = np.random.default_rng([self.seed, self.stream, block, epoch])  # 4 words: never an order's seed
        candidates = np.flatnonzero(~np.isin(tokens, self.special))
        n_mask = min(len(candidates), int(self.masking_probability * len(candidates) + rng.random()))
        chosen = np.sort(rng.choice(candidates, size=n_mask, replace=False))
        text = tokens.copy()
        u = rng.random(n_mask)
        to_mask, to_random = chosen[u < 0.8], chosen[(u >= 0.8) & (u < 0.9)]
        text[to_mask] = self.mask
        text[to_random] = rng.choice(self.replacements, size=len(to_random))

        n, pad = len(tokens), self.seq_length - len(tokens)
        labels = np.full(self.seq_length, -1, dtype=np.int64)
        labels[chosen] = tokens[chosen]
        loss_mask = np.zeros(self.seq_length, dtype=np.int64)
        loss_mask[chosen] = 1
        padding_mask = segment_ids([len(p) for p in parts], self.seq_length)  # 1 per token (1, 2, ... packed)
        return {"text": np.pad(text, (0, pad), constant_values=self.pad),
                "types": np.zeros(self.seq_length, dtype=np.int64), "labels": labels, "loss_mask": loss_mask,
                "padding_mask": padding_mask, "is_random": 0}


def build_roberta_splits(prefix: str, splits_string: str, sizes: list[int], seq_length: int, tokenizer,
                         masking_probability: float, seed: int,
                         packing: str | None = None) -> tuple[RobertaDataset, RobertaDataset | None]:
    """Train and validation datasets of one indexed prefix, split by document as megatron-core splits."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    indexed = IndexedDataset(prefix)
    n_docs = len(indexed.document_indices) - 1
    ranges = document_split(n_docs, splits_string)
    if ranges[0] is None:
        raise DataError(f"split {splits_string!r} leaves no training documents ({n_docs} in all)", prefix)
    out = [RobertaDataset(indexed, r, n, seq_length, tokenizer, masking_probability, seed, name, packing)
           if r is not None and n > 0 else None
           for r, n, name in zip(ranges[:2], sizes[:2], ("train", "valid"))]
    return out[0], out[1]
