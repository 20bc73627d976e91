"""ModernBERT pretraining through the real pretraining path (``tiny_modernbert``: megatron-core's BERT samples
without NSP, 30% masking): the MLM loss falls, TP2, DP2 + distributed optimizer and TP2 x PP2 give the TP1 losses
(weights are initialised per global key, the GeGLU fc1's two halves each under its own key, so layouts start equal;
megatron-core splits the gated MLP's halves over TP; at PP2 layers 1-2 and 3-4 sit on two stages, layer 4 global by
its global number, the decoder tied to the word embeddings across stages), and a run stopped at a checkpoint resumes
to the uninterrupted run's losses."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import run_world
from layouts import (LAYOUTS, PIPELINE_LAYOUTS, assert_layout_matches, assert_resumes_exactly, pretrain_rank,
                     reference_run)

from engine.pretrain_runs import losses, overrides

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml"
STEPS = 20


def modernbert_rank(over: list[str]) -> dict:
    """One forked rank of ``bio-megatron pretrain --config tiny_modernbert`` (the CLI path minus argument
    parsing)."""
    return pretrain_rank(RECIPE, over)


@pytest.fixture(scope="module")
def reference(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("modernbert_layouts")
    return root, reference_run(modernbert_rank, pubmed_prefix, root, STEPS)


def test_tiny_modernbert_mlm_loss_falls(reference):
    root, ref = reference
    config = (root / "tp1" / "checkpoints").rglob("config.yaml")
    assert any("family: modernbert" in p.read_text() for p in config)
    # MLM only (ln 30,522 ~ 10.3 at the start): the optimizer moves the bias-free layers and the head
    first, last = (sum(ref[s] for s in steps) / 3 for steps in (range(1, 4), range(STEPS - 2, STEPS + 1)))
    assert 9.8 < first < 10.8, ref
    assert last < first - 1.0, ref


@pytest.mark.parametrize("name", [*LAYOUTS, *PIPELINE_LAYOUTS])
def test_modernbert_layout_matches_tp1(name, reference, pubmed_prefix):
    root, ref = reference
    assert_layout_matches(modernbert_rank, name, root, ref, pubmed_prefix, STEPS)


def test_modernbert_resumes_exactly_from_a_checkpoint(reference, pubmed_prefix):
    """Steps 11-20 resumed from the reference's step-10 checkpoint are the uninterrupted run's."""
    root, ref = reference
    assert_resumes_exactly(modernbert_rank, root, ref, pubmed_prefix, STEPS)


def test_modernbert_tp1_checkpoint_resumes_at_tp2_pp2(reference, pubmed_prefix):
    """The reference's step-10 checkpoint (TP1) resumed at TP2 x PP2: dist-checkpointing reshards each layer to its
    stage by its global number and the last stage's copy of the tied decoder weight from the word embeddings;
    steps 11-20 are the uninterrupted TP1 run's within the layouts' tolerance."""
    root, ref = reference
    assert_resumes_exactly(modernbert_rank, root, ref, pubmed_prefix, STEPS, layout="tp2pp2", tol=1e-5)


def test_context_extension_continues_the_weights_at_a_longer_length_with_a_new_global_base(reference, pubmed_prefix):
    """The context-extension step (modernbert_base_context_extension's keys at tiny scale): the step-10 weights
    continue at twice the length (64) with the global RoPE base raised 10x; the weights load unchanged (rotary: no
    position table), so the first loss is the trained model's, well below a fresh one's (~10.3)."""
    from bio_megatron.config.pretrain import load_pretrain_config

    root, ref = reference
    last = root / "tp1" / "checkpoints" / f"iter_{STEPS // 2:07d}"
    assert last.is_dir(), sorted(p.name for p in last.parent.iterdir())
    over = overrides(pubmed_prefix, root, "extended", steps=2, extra=(
        f"model.restore_from_path={last}", "model.encoder_seq_length=64", "model.global_rope_theta=1600000.0"))
    (res,) = run_world(1, modernbert_rank, over)
    got = losses(root / "extended")
    assert res["status"] == "finished" and sorted(got) == [1, 2], got
    assert got[1] < ref[1] - 0.3, (got, ref[1])
    recipes = {n: load_pretrain_config(RECIPE.with_name(f"{n}.yaml"), [f"model.restore_from_path={last}"]).model
               for n in ("modernbert_base", "modernbert_base_context_extension")}
    one, two = recipes["modernbert_base"], recipes["modernbert_base_context_extension"]
    assert (one.encoder_seq_length, one.global_rope_theta) == (1024, 10000.0)
    assert (two.encoder_seq_length, two.global_rope_theta, two.local_rope_theta) == (8192, 160000.0, 10000.0)
    assert two.require_restore_from_path


def test_bf16_losses_stay_close_to_fp32(reference, pubmed_prefix):
    """trainer.precision bf16 (bf16 weights and activations, fp32 main parameters) follows the fp32 losses of the
    first five steps within bf16's rounding."""
    root, ref = reference
    over = overrides(pubmed_prefix, root, "bf16", steps=STEPS, extra=("trainer.precision=bf16",))
    (res,) = run_world(1, modernbert_rank, over)  # the reference's schedule: the same learning rate at each step
    got = losses(root / "bf16")
    assert res["status"] == "finished" and sorted(got) == sorted(ref), got
    for step in range(1, 6):
        assert got[step] == pytest.approx(ref[step], abs=0.01), (step, got, ref)  # measured: < 1e-3


def test_finetuning_modernbert_at_tp2_pp2_equals_tp1(reference, tmp_path):
    """``finetune ner`` (3 steps, tiny_ner's BC5CDR-chem slice) from the reference's step-10 ModernBERT at TP1 and at
    TP2 x PP2 (embedding and layers 1-2 on the first stage, layers 3-4 and ModernBERT's task head on the last): the
    same losses and dev F1."""
    from finetune.ft_runs import finetune_rank

    root, _ = reference
    quick = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=16",
             "model.dataset.test_file=null", "model.dataset.max_seq_length=64", "model.micro_batch_size=4",
             "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.head.fc_dropout=0.0",
             f"exp_manager.exp_dir={tmp_path}",
             f"model.restore_from_path={root / 'tp1' / 'checkpoints' / f'iter_{STEPS // 2:07d}'}"]
    (ref,) = run_world(1, finetune_rank, "ner", quick + ["exp_manager.name=tp1"])
    runs = run_world(4, finetune_rank, "ner", quick + ["exp_manager.name=tp2pp2", "model.tensor_model_parallel_size=2",
                                                       "model.pipeline_model_parallel_size=2"])
    assert len(ref["losses"]) == 3 and ref["losses"][0] > 0.1, ref["losses"]
    for res in (runs[0], runs[3]):  # a first-stage and a last-stage rank report the run's numbers
        assert max(abs(a - b) for a, b in zip(res["losses"], ref["losses"])) < 1e-5, (res["losses"], ref["losses"])
        assert abs(res["dev"]["f1"] - ref["dev"]["f1"]) < 1e-9


def _stage_layers(pp: int) -> list:
    """This rank's ModernBERT stage at PP ``pp`` (tiny_modernbert): per layer (global number, rotary base, half
    window or None for global attention, input-norm class), and which of the embedding / MLM head / a weight of
    its own on the output layer it holds."""
    from megatron.core import parallel_state as ps

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.models.modernbert import build_modernbert_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, pp, seed=1)
    m = load_pretrain_config(RECIPE, [f"model.pipeline_model_parallel_size={pp}"], world_size=pp).model
    model = build_modernbert_model(m, 1000)
    layers = [(layer.layer_number, layer.self_attention.rope_base, layer.self_attention.core_attention.half_window,
               type(layer.input_layernorm).__name__) for layer in model.encoder.layers]
    return {"stage": ps.get_pipeline_model_parallel_rank(), "layers": layers,
            "embedding": hasattr(model, "embedding"), "lm_head": hasattr(model, "lm_head"),
            "output_weight": getattr(getattr(model, "output_layer", None), "weight", None) is not None}


def test_each_stage_builds_its_layers_by_their_global_number():
    """At PP2 the first stage holds the embedding and layers 1-2, the last layers 3-4, the MLM head and its own copy
    of the tied decoder weight; each layer's rotary base, window and (layer 0's unapplied) norm are the TP1 model's
    for the same global layer (global on layers 1 and 4 of tiny_modernbert's 4, every 3rd from the first)."""
    (one,) = run_world(1, _stage_layers, 1)
    first, last = run_world(2, _stage_layers, 2)
    assert (one["embedding"], one["lm_head"], one["output_weight"]) == (True, True, False), one
    assert (first["embedding"], first["lm_head"], first["output_weight"]) == (True, False, False), first
    assert (last["embedding"], last["lm_head"], last["output_weight"]) == (False, True, True), last
    assert first["layers"] + last["layers"] == one["layers"], (first, last, one)
    assert [n for n, _, window, _ in one["layers"] if window is None] == [1, 4], one
    assert [norm for *_, norm in one["layers"]] == ["UnappliedNorm"] + ["BiasFreeLayerNorm"] * 3, one
