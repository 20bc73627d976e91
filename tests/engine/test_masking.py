"""``model.data.masking``: whole-word masking keeps every word's WordPiece pieces together, token masking
does not; checked on real samples of the bundled PubMed corpus drawn through our data pipeline
(megatron-core's BERT dataset), and the old ``whole_word_masking`` key as an alias."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bio_megatron.config.pretrain import load_pretrain_config
from bio_megatron.utils.errors import ConfigError

N_SAMPLES = 200
TINY = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny.yaml"


def _word_spans(tokens: list[str]) -> list[tuple[int, int]]:
    """[start, end) of every word of two or more pieces (a start followed by ``##`` continuations).

    ``##`` pieces right after [CLS]/[SEP] are the tail of a word cut off by megatron-core's random
    truncation of a segment's front: no word of this sample, so they are left out."""
    spans, start = [], None
    for i, t in enumerate(tokens + ["[END]"]):
        if t.startswith("##"):
            continue
        if start is not None and i - start > 1:
            spans.append((start, i))
        start = None if t in ("[CLS]", "[SEP]", "[PAD]") else i
    return spans


def _mask_stats(prefix: str, cache: str, overrides: list[str]) -> dict[str, int]:
    """Masked positions, and multi-piece words masked only in part, over the first training samples."""
    from bio_megatron.data.pretrain import PretrainData, load_tokenizer

    cfg = load_pretrain_config(TINY, [f"model.data.data_prefix={prefix}",
                                                                  "trainer.max_steps=50", *overrides])
    tok = load_tokenizer(cfg)
    data = PretrainData(cfg, tok, dp_rank=0, dp_size=1, cache_dir=Path(cache))
    stats = {"masked": 0, "multi_piece_masked": 0, "partial": 0, "whole_word": int(cfg.model.data.whole_word())}
    for i in range(N_SAMPLES):
        s = data.train[i]
        lm = np.asarray(s["loss_mask"]).astype(bool)
        # the original tokens: labels hold them where a position was chosen, text everywhere else
        orig = np.where(lm, np.asarray(s["labels"]), np.asarray(s["text"]))
        pieces = [tok.inv_vocab[int(t)] for t in orig]
        stats["masked"] += int(lm.sum())
        for a, b in _word_spans(pieces):
            chosen = int(lm[a:b].sum())
            stats["multi_piece_masked"] += int(chosen == b - a)
            stats["partial"] += int(0 < chosen < b - a)
    return stats


def _all_modes(prefix: str, cache_root: str) -> list[dict[str, int]]:
    from bio_megatron.parallel.distributed import init_distributed

    init_distributed()  # megatron-core's index builder asks the process group for the rank
    modes = [["model.data.masking=whole_word"], ["model.data.masking=token"],
             ["model.data.masking=null", "model.data.whole_word_masking=false"]]
    return [_mask_stats(prefix, f"{cache_root}/{k}", o) for k, o in enumerate(modes)]


def test_whole_word_masks_whole_words_and_token_does_not(pubmed_prefix, tmp_path):
    from harness import run_world

    (whole, token, alias), = run_world(1, _all_modes, str(pubmed_prefix), str(tmp_path))
    assert whole["whole_word"] == 1 and token["whole_word"] == 0 and alias["whole_word"] == 0
    # whole_word: many multi-piece words were chosen, never one of them in part
    assert whole["masked"] > 0.1 * N_SAMPLES * 8 and whole["multi_piece_masked"] > 50, whole
    assert whole["partial"] == 0, whole
    # token: pieces are drawn independently, so words get split (the same holds through the old key)
    assert token["partial"] > 20, token
    assert alias == token


def test_conflicting_masking_keys_are_refused():
    with pytest.raises(ConfigError, match=r"model.data.masking \(token\) contradicts model.data.whole_word_masking"):
        load_pretrain_config(TINY,
                             ["model.data.masking=token", "model.data.whole_word_masking=true"])
    # the old key alone still decides when masking is unset (checkpoints' config.yaml written before the key)
    cfg = load_pretrain_config(TINY,
                               ["model.data.masking=null", "model.data.whole_word_masking=true"])
    assert cfg.model.data.whole_word()
