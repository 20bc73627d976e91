"""Post-LN BERT (``model.transformer_block_type: post_ln``) on the engine: the same tiny run on the bundled corpus
(dropout off, several Adam steps) gives the TP1 losses under TP2, TP2xPP2 and DP2 with the distributed
optimizer; a TP2 checkpoint resumes at PP2 with the same next losses; the layer really is post-LN (its
losses differ from pre-LN's, its checkpoint holds the embedding LayerNorm and no final LayerNorm)."""

from __future__ import annotations

import pytest
import yaml
from architectures.hf_parity import export_mlm
from harness import run_world

from engine.pretrain_runs import losses, overrides, pretrain_rank

POST_LN = ("model.transformer_block_type=post_ln",)
LAYOUTS = {  # name: (world, tp, pp, distributed optimizer)
    "tp2": (2, 2, 1, False),
    "tp2pp2": (4, 2, 2, False),
    "dp2_distopt": (2, 1, 1, True),
}
STEPS = 4


def _run(prefix, root, name: str, world: int = 1, tp: int = 1, pp: int = 1, distopt: bool = False,
         every: int = 0, extra: tuple[str, ...] = POST_LN) -> dict[int, float]:
    run_world(world, pretrain_rank, overrides(prefix, root, name, tp=tp, pp=pp, distopt=distopt, steps=STEPS,
                                              every=every, extra=extra))
    return losses(root / name)


@pytest.fixture(scope="module")
def reference(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("post_ln")
    ref = _run(pubmed_prefix, root, "tp1")
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert abs(ref[STEPS] - ref[1]) > 1e-3  # the optimizer really moved the model
    return root, ref


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_post_ln_layout_matches_tp1(name, reference, pubmed_prefix):
    root, ref = reference
    world, tp, pp, distopt = LAYOUTS[name]
    got = _run(pubmed_prefix, root, name, world, tp, pp, distopt, every=2 if name == "tp2" else 0)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (name, step, got, ref)


def test_post_ln_tp2_checkpoint_resumes_at_pp2(reference, pubmed_prefix):
    root, ref = reference
    if not (root / "tp2" / "checkpoints").exists():  # test selected alone
        _run(pubmed_prefix, root, "tp2", 2, 2, every=2)
    ckpt = root / "tp2" / "checkpoints" / "iter_0000002"
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    assert saved["model"]["transformer_block_type"] == "post_ln"
    got = _run(pubmed_prefix, root, "from_tp2_pp2", 2, 1, 2,
               extra=POST_LN + (f"exp_manager.resume_from_checkpoint={ckpt}",))
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (step, got, ref)


def test_post_ln_differs_from_pre_ln(reference, pubmed_prefix):
    root, ref = reference
    pre = _run(pubmed_prefix, root, "pre_ln", extra=())
    assert abs(pre[1] - ref[1]) > 1e-3, (pre, ref)


def _keys(tp: int, pp: int) -> list[str]:
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(tp, pp, seed=1)
    model = build_model(ModelConfig(size="tiny", transformer_block_type="post_ln", tensor_model_parallel_size=tp,
                                    pipeline_model_parallel_size=pp), 1000)
    return sorted({sh.key for sh in model.sharded_state_dict().values() if hasattr(sh, "global_shape")})


def test_post_ln_sharded_keys_per_stage():
    """The embedding LayerNorm lives on the first stage only; no stage has a final LayerNorm."""
    first, _, last, _ = run_world(4, _keys, 2, 2)
    for key in ("embedding.layernorm.weight", "encoder.layers.post_attention_layernorm.weight",
                "encoder.layers.post_mlp_layernorm.bias"):
        assert key in first
    assert "embedding.layernorm.weight" not in last and "lm_head.layer_norm.weight" in last
    assert not [k for k in first + last if "final_layernorm" in k or "input_layernorm" in k
                or "pre_mlp_layernorm" in k or "linear_qkv.layer_norm" in k]


def test_post_ln_checkpoint_exports_to_bert_for_masked_lm(reference, pubmed_prefix):
    root, _ = reference
    if not (root / "tp2" / "checkpoints").exists():  # test selected alone
        _run(pubmed_prefix, root, "tp2", 2, 2, every=2)
    # ``export hf`` of the engine-trained post-LN checkpoint -> BertForMaskedLM with our MLM logits
    (res,) = run_world(1, export_mlm, str(root / "tp2" / "checkpoints"), str(root / "hf_mlm"), 12)
    assert res["class"] == "BertForMaskedLM" and res["scale"] > 0.1 and res["diff"] < 1e-4, res


def test_post_ln_with_transformer_engine_is_refused():
    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig, validate
    from bio_megatron.utils.errors import ConfigError

    cfg = PretrainConfig(model=ModelConfig(size="tiny", transformer_block_type="post_ln",
                                           transformer_impl="transformer_engine"))
    with pytest.raises(ConfigError, match="post_ln"):
        validate(cfg)
