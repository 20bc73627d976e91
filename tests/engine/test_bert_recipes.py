"""The PubMedBERT and BioM-BERT recipes resolve to post-LN BERT with their masking unit (PubMedBERT whole words;
BioM-BERT single WordPieces, as ELECTRA's BERT code it names masks: docs/RECIPES.md), and the size the
CLI reports (``pretrain --dry-run``) equals the parameter count of transformers' own BERT of the papers'
shape (BERT-base: transformers' ``BertConfig`` defaults; BERT-large: Devlin et al.'s 24 x 1024, 16 heads)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from harness import cli_forked

from bio_megatron.config.pretrain import load_pretrain_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "nemo_configs" / "pretrain"
# The recipes name a PubMed vocabulary learned by `vocab train` (a placeholder path); any WordPiece vocab
# of the same kind gives the count for its size.
VOCAB = "bert_base_uncased"

BERT_LARGE = dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096)


def _dry_run(recipe: str) -> dict:
    with contextlib.chdir(ROOT):  # the forked command starts where the subprocess did: recipe names resolve there
        out = cli_forked(["pretrain", "--config", recipe, f"model.tokenizer.vocab_file={VOCAB}", "--dry-run",
                          "--skip-path-checks"], env={"PYTHONWARNINGS": "ignore"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _hf_count(shape: dict, vocab: int, binary_head: bool) -> int:
    from transformers import BertConfig, BertForMaskedLM, BertForPreTraining

    cfg = BertConfig(vocab_size=vocab, max_position_embeddings=512, type_vocab_size=2, **shape)
    with torch.device("meta"):
        # ForPreTraining = MLM + pooler + NSP; ForMaskedLM has no pooler, as megatron-core without the binary head
        model = (BertForPreTraining if binary_head else BertForMaskedLM)(cfg)
    return sum(p.numel() for p in model.parameters())  # the tied decoder weight counted once


@pytest.mark.parametrize("recipe, hf_shape, masking", [("pubmedbert_base", {}, "whole_word"),
                                                       ("biom_bert_large", BERT_LARGE, "token")])
def test_recipe_is_post_ln_with_its_masking_and_hf_sized(recipe, hf_shape, masking):
    cfg = load_pretrain_config(RECIPES / f"{recipe}.yaml")
    assert cfg.model.transformer_block_type == "post_ln"
    assert cfg.model.data.masking == masking and cfg.model.data.whole_word() == (masking == "whole_word")

    report = _dry_run(recipe)
    assert report["config"]["model"]["transformer_block_type"] == "post_ln"
    assert report["config"]["model"]["data"]["masking"] == masking
    expected = _hf_count(hf_shape, report["padded_vocab_size"], cfg.model.bert_binary_head)
    assert report["parameters"] == expected


def test_pubmedbert_second_stage_at_512_validates():
    cfg = load_pretrain_config(RECIPES / "pubmedbert_base.yaml",
                               ["model.encoder_seq_length=512", "model.restore_from_path=runs/x/checkpoints"])
    assert cfg.model.encoder_seq_length == 512 and cfg.model.global_batch_size == 8192
