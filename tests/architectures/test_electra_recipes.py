"""The ELECTRA recipes (BioELECTRA, BioM-ELECTRA) resolve to post-LN ELECTRA, and the size the CLI reports
(``pretrain --dry-run``) equals the parameter count of transformers' ``ElectraForPreTraining`` (discriminator)
plus ``ElectraForMaskedLM`` (generator) of the published ELECTRA-base / ELECTRA-large shapes, the embedding
they share counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bio_megatron.cli import main
from bio_megatron.config.pretrain import load_pretrain_config

RECIPES = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain"
VOCAB = "bert_base_uncased"  # the recipes name a PubMed vocabulary to be learned; any WordPiece vocab sizes them
# google/electra-{base,large}-{discriminator,generator}'s published configs (Clark et al. 2020)
GENERATOR = dict(hidden_size=256, num_attention_heads=4, intermediate_size=1024)
BASE = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072)
LARGE = dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096)


def _hf_count(disc: dict, vocab: int) -> int:
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    common = dict(vocab_size=vocab, embedding_size=disc["hidden_size"], max_position_embeddings=512, type_vocab_size=2)
    with torch.device("meta"):
        d = ElectraForPreTraining(ElectraConfig(**common, **disc))
        g = ElectraForMaskedLM(ElectraConfig(**common, **GENERATOR, num_hidden_layers=disc["num_hidden_layers"]))
    shared = sum(p.numel() for p in g.electra.embeddings.parameters())
    return sum(p.numel() for p in d.parameters()) + sum(p.numel() for p in g.parameters()) - shared


@pytest.mark.parametrize("recipe, disc", [("bioelectra_base", BASE), ("biom_electra_base", BASE),
                                          ("biom_electra_large", LARGE)])
def test_recipe_is_post_ln_electra_and_hf_sized(recipe, disc, capsys):
    cfg = load_pretrain_config(RECIPES / f"{recipe}.yaml")
    assert (cfg.model.objective, cfg.model.transformer_block_type, cfg.model.bert_binary_head) == \
        ("electra", "post_ln", False)
    assert main(["pretrain", "--config", recipe, f"model.tokenizer.vocab_file={VOCAB}", "--dry-run",
                 "--skip-path-checks"]) == 0  # (the recipe's corpus is a placeholder path)
    report = json.loads(capsys.readouterr().out)
    assert report["generator"]["hidden_size"] == GENERATOR["hidden_size"]
    assert report["generator"]["num_attention_heads"] == GENERATOR["num_attention_heads"]
    assert report["parameters"] == _hf_count(disc, report["padded_vocab_size"])
