"""ModernBERT's exact parameter count (``Family.parameter_count``: what ``pretrain --dry-run``, the memory check and
the benchmark report's #Parameters read) equals the parameters of the model ``build_pretraining_model`` builds, for
the tiny recipe and a ModernBERT-base-shaped layer stack (no biases but the decoder's, no position table, GeGLU,
tied decoder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import run_world

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml"


def _count_and_built(over: list[str], vocab: int) -> tuple[int, int]:
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families import family_of_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    m = load_pretrain_config(RECIPE, ["model.tokenizer.vocab_file=unused", *over], 1).model
    family = family_of_model(m)
    model = family.build_pretraining_model(m, vocab, torch.float32)
    padded = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, 1)
    return family.parameter_count(m, padded), sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("over", [[], ["model.num_layers=2", "model.hidden_size=768", "model.num_attention_heads=12",
                                       "model.ffn_hidden_size=1152"]], ids=["tiny", "base_layers"])
def test_parameter_count_is_the_built_models(over):
    ((counted, built),) = run_world(1, _count_and_built, over, 1000)
    assert counted == built, (counted, built)
