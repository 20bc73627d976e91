"""Pretraining samples: megatron-core's BERT masked WordPiece dataset over indexed ``.bin/.idx`` data.

Sample order is a pure function of the global step: global batch ``s`` holds samples
``[s*GB, (s+1)*GB)``, and data-parallel rank ``r`` takes its contiguous share. Every layout therefore
sees the same global batch, and resuming at step ``s`` needs nothing but ``s`` (the data position).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bio_megatron.config.pretrain import PretrainConfig, data_blend
from bio_megatron.utils.errors import ConfigError, DataError
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.builtin import resolve_vocab
from bio_megatron.vocab.wordpiece import WordPieceTokenizer

log = get_logger(__name__)


def load_tokenizer(cfg: PretrainConfig) -> WordPieceTokenizer:
    """WordPiece ``vocab.txt`` (or a built-in name), or a byte-level BPE folder / ``vocab.json`` (RoBERTa)."""
    from bio_megatron.vocab.bpe import load_tokenizer as load_any

    return load_any(resolve_vocab(cfg.model.tokenizer.vocab_file), cfg.model.tokenizer.do_lower_case)


def check_prefixes(cfg: PretrainConfig, vocab_size: int, tokenizer: object | None = None) -> None:
    """Fail before any work when a data prefix is missing, holds token ids outside the vocabulary, or was
    tokenized (by its record, ``corpus/record.py``) with another vocabulary or casing than ``tokenizer``."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from bio_megatron.corpus.record import check_data_vocab

    prefixes, _ = data_blend(cfg.model.data)
    if not prefixes:
        raise ConfigError("model.data.data_prefix is empty: give [weight, /path/prefix, ...] of indexed data "
                          "written by `bio-megatron data tokenize`")
    for p in prefixes:
        missing = [s for s in (".bin", ".idx") if not os.path.isfile(p + s)]
        if missing:
            raise DataError(f"data prefix has no {' / '.join(missing)} file (model.data.data_prefix; "
                            "expected megatron indexed data <prefix>.bin/.idx)", p)
        ds = IndexedDataset(p)
        # A vocabulary mismatch shows up as ids past the end of the table: check a spread of sequences.
        n = len(ds)
        if n == 0:
            raise DataError("indexed dataset holds no sequences", p + ".idx")
        probe = np.concatenate([ds[int(i)] for i in np.linspace(0, n - 1, num=min(n, 256)).astype(int)])
        if probe.size and int(probe.max()) >= vocab_size:
            raise DataError(f"token id {int(probe.max())} is outside the vocabulary ({vocab_size} entries, "
                            f"model.tokenizer.vocab_file={cfg.model.tokenizer.vocab_file}); was the data "
                            "tokenized with another vocab?", p + ".bin")
        # Ids in range do not make the same vocabulary (a permuted one of the same size passes): the record's hash.
        if tokenizer is not None:
            check_data_vocab(p, tokenizer, cfg.model.tokenizer.vocab_file, cfg.model.data.skip_vocab_check)


@dataclass
class Split:
    dataset: object
    name: str

    def __len__(self) -> int:
        return len(self.dataset)


class PretrainData:
    """Train / validation samples for this data-parallel rank."""

    def __init__(self, cfg: PretrainConfig, tokenizer: WordPieceTokenizer, dp_rank: int, dp_size: int,
                 cache_dir: Path):
        from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

        m, t = cfg.model, cfg.trainer
        self.micro_batch_size, self.global_batch_size = m.micro_batch_size, m.global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.num_microbatches = m.global_batch_size // (m.micro_batch_size * dp_size)
        check_prefixes(cfg, tokenizer.vocab_size, tokenizer)
        if m.objective == "mlm":  # RoBERTa: our packed, dynamically masked dataset (no [PAD] = 0 needed)
            from bio_megatron.data.roberta import build_roberta_splits

            self.train, self.valid = build_roberta_splits(
                data_blend(m.data)[0][0], m.data.splits_string,
                [t.max_steps * m.global_batch_size, t.limit_val_batches * m.global_batch_size],
                m.encoder_seq_length, tokenizer, m.data.masked_lm_prob,
                m.data.seed if m.data.seed is not None else t.seed, m.data.packing)
            return
        ds_cfg = BERTMaskedWordPieceDatasetConfig(
            random_seed=m.data.seed if m.data.seed is not None else t.seed,
            sequence_length=m.encoder_seq_length, blend=data_blend(m.data), split=m.data.splits_string,
            path_to_cache=str(cache_dir), tokenizer=tokenizer,
            masking_probability=m.data.masked_lm_prob, short_sequence_probability=m.data.short_seq_prob,
            masking_max_ngram=m.data.max_ngram, masking_do_full_word=m.data.whole_word(),
            masking_do_permutation=False, masking_use_longer_ngrams=False,
            masking_use_geometric_distribution=False, classification_head=m.bert_binary_head,
        )
        n_val = t.limit_val_batches * m.global_batch_size
        sizes = [t.max_steps * m.global_batch_size, n_val, 0]
        try:
            train, valid, _ = BlendedMegatronDatasetBuilder(
                BERTMaskedWordPieceDataset, sizes, lambda: True, ds_cfg).build()
        except (AssertionError, IndexError) as exc:  # megatron-core reports data problems with bare asserts
            raise DataError(f"megatron-core could not build the BERT dataset ({type(exc).__name__}: {exc}); "
                            f"does every non-zero part of split {m.data.splits_string!r} get at least one "
                            f"document? (prefixes {data_blend(m.data)[0]})") from None
        if train is None:
            raise DataError(f"split {m.data.splits_string!r} leaves no training documents", data_blend(m.data)[0][0])
        self.train, self.valid = train, valid

    def _microbatches(self, dataset, global_step: int) -> list[dict[str, torch.Tensor]]:
        per_rank = self.micro_batch_size * self.num_microbatches
        start = global_step * self.global_batch_size + self.dp_rank * per_rank
        out = []
        for j in range(self.num_microbatches):
            first = start + j * self.micro_batch_size
            batch = collate([dataset[(first + k) % len(dataset)] for k in range(self.micro_batch_size)])
            # The sample's position in the split's sample order (not wrapped around an epoch): a layout-free
            # key for per-sample randomness, such as ELECTRA's Gumbel noise.
            batch["sample_index"] = torch.arange(first, first + self.micro_batch_size, dtype=torch.int64)
            out.append(batch)
        return out

    def train_microbatches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """The micro-batches of global batch ``step`` that belong to this data-parallel rank."""
        return self._microbatches(self.train, step)

    def valid_microbatches(self, k: int) -> list[dict[str, torch.Tensor]]:
        return self._microbatches(self.valid, k) if self.valid is not None else []


def collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Stack samples; ``padding_mask`` is 1 per token, or 1, 2, ... per packed document (``data/packing.py``)."""
    keys = ("text", "types", "labels", "is_random", "padding_mask", "loss_mask")
    return {k: torch.from_numpy(np.stack([np.asarray(s[k]) for s in samples]).astype(np.int64)) for k in keys}
