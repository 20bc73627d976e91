"""Every pretraining recipe loads and validates; sizes' parameter counts are exact without allocating
(checked against megatron-core itself for tiny, and against Hugging Face's MegatronBert built on the
meta device for the large shapes); config errors name the key and quote the values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bio_megatron.config.pretrain import load_pretrain_config
from bio_megatron.config.sizes import SIZES, padded_vocab_size, parameter_count
from bio_megatron.utils.errors import ConfigError

RECIPES = sorted((Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain").glob("[!_]*.yaml"))


def test_recipe_set_is_complete():
    assert {p.stem for p in RECIPES} >= {"tiny", "biomegatron_345m", "biomegatron_800m", "biomegatron_1.2b"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_validates(recipe):
    # the 1.2b recipe starts from a general-domain checkpoint (tests/config/test_paper_recipes.py checks the refusal)
    over = ["model.restore_from_path=ckpt/general"] if "require_restore_from_path" in recipe.read_text() else []
    cfg = load_pretrain_config(recipe, over)
    tp, pp = cfg.model.tensor_model_parallel_size, cfg.model.pipeline_model_parallel_size
    load_pretrain_config(recipe, over, world_size=tp * pp * 2)  # a real layout for it validates too
    assert cfg.model.size in SIZES


@pytest.mark.parametrize("size", ["345m", "800m", "1.2b"])
def test_parameter_count_equals_hugging_face_on_meta_device(size):
    from transformers import MegatronBertForPreTraining

    from bio_megatron.models.hf_convert import hf_config

    shape, vocab = SIZES[size], 28_996
    padded = padded_vocab_size(vocab)
    with torch.device("meta"):
        hf = MegatronBertForPreTraining(hf_config(shape, padded, 512))
    hf_count = sum(p.numel() for p in hf.parameters())  # tied decoder weight counted once
    assert parameter_count(shape, padded, 512, 2, binary_head=True) == hf_count
    assert 0.3e9 < parameter_count(shape, padded) < 1.4e9


def _count_tiny(binary_head: bool) -> tuple[int, int]:
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, 0)
    m = ModelConfig(size="tiny", bert_binary_head=binary_head)
    model = build_model(m, 30_522)
    real = sum(p.numel() for p in model.parameters())
    return real, parameter_count(m.shape(), padded_vocab_size(30_522), 512, 2, binary_head)


@pytest.mark.parametrize("binary_head", [False, True])
def test_parameter_count_equals_megatron_core(binary_head):
    from harness import run_world

    (real, formula), = run_world(1, _count_tiny, binary_head)
    assert real == formula


@pytest.mark.parametrize(("size", "dims", "name"), [
    ("345m", {}, "345m"), ("large", {}, "large"),  # the same dims as 345m: the size given is the name
    ("345m", {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12}, "base"),  # NeMo's pretraining config
    ("345m", {"num_layers": 6}, "custom")])
def test_size_name_is_the_row_the_shape_equals(size, dims, name):
    """The name a run's checkpoint and log carry: ``model.size``, or the table row its overridden shape equals."""
    from bio_megatron.config.pretrain import ModelConfig

    assert ModelConfig(size=size, **dims).size_name() == name


def test_vocab_padding_matches_anchor():
    assert padded_vocab_size(28_996) == 29_056
    assert padded_vocab_size(28_996, tensor_parallel_size=2) % 256 == 0


@pytest.mark.parametrize("overrides, world, needles", [
    (["model.nonsense=1"], None, ["unknown key 'model.nonsense'"]),
    (["model.optim.lr=fast"], None, ["'model.optim.lr' = 'fast'", "float"]),
    (["model.pipeline_model_parallel_size=5"], None, ["num_layers (24) must be divisible by pipeline_model_parallel_size (5)"]),
    (["model.tensor_model_parallel_size=3"], None, ["num_attention_heads (16) must be divisible by tensor_model_parallel_size (3)"]),
    (["model.tensor_model_parallel_size=2"], 3, ["(2 * 1 = 2) must divide the world size (3)"]),
    (["model.global_batch_size=100", "model.micro_batch_size=16"], None, ["global_batch_size (100) must be a multiple of micro_batch_size (16)"]),
])
def test_config_errors_quote_values(overrides, world, needles):
    recipe = next(p for p in RECIPES if p.stem == "biomegatron_345m")
    with pytest.raises(ConfigError) as exc:
        load_pretrain_config(recipe, overrides, world)
    for needle in needles:
        assert needle in str(exc.value)


def test_all_problems_reported_at_once():
    recipe = next(p for p in RECIPES if p.stem == "biomegatron_345m")
    with pytest.raises(ConfigError) as exc:
        load_pretrain_config(recipe, ["model.pipeline_model_parallel_size=5", "model.tensor_model_parallel_size=3"])
    text = "\n".join(exc.value.problems)
    assert "pipeline_model_parallel_size (5)" in text and "num_attention_heads (16)" in text
