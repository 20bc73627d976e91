"""ELECTRA pretraining (``model.objective: electra``, recipe ``tiny_electra``) on the bundled PubMed/PMC corpus.

- TP2 and DP2 with the distributed optimizer give TP1's generator and discriminator losses (dropout off):
  the Gumbel samples are identical because their noise is a function of the sample, not of the layout;
- a checkpoint holds both networks under the agreed keys; resuming from it (TP2 checkpoint at TP1, and a
  distributed-optimizer checkpoint at DP2) continues with the uninterrupted run's losses;
- fine-tuning from an ELECTRA checkpoint starts from the discriminator (its embedding + encoder);
- state-dict keys: the discriminator's are a post-LN ``BioBertModel``'s, the generator's layers have the same
  structure; parameter counts equal the formula, which the recipes test checks against transformers' ELECTRA;
- pipeline parallelism, the NSP head and pre-LN are refused with the reason;
- learning: within 150 CPU steps the discriminator catches replaced tokens (recall > 0) and is more accurate
  than answering "original" everywhere, with a loss below the best constant predictor's (binary entropy).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from harness import run_world

from bio_megatron.config.pretrain import load_pretrain_config
from bio_megatron.utils.errors import ConfigError
from engine.pretrain_runs import overrides

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_electra.yaml"
STEPS = 4
LOSSES = ("loss", "generator_loss", "discriminator_loss")


def electra_rank(over: list[str]) -> str:
    """What one forked rank runs: the real CLI path on the tiny_electra recipe, minus argument parsing."""
    import os

    import torch.distributed as dist

    from bio_megatron.training.pretrain import run_pretraining

    status = run_pretraining(load_pretrain_config(RECIPE, over, world_size=int(os.environ["WORLD_SIZE"])))
    dist.barrier()
    return status


def records(run_dir: Path) -> dict[int, dict]:
    """step -> training record of metrics.jsonl (a resumed run's later record for a step wins)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec
    return out


def _assert_same_losses(got: dict, ref: dict, steps, tol: float = 1e-5) -> None:
    assert sorted(got) == list(steps)
    for s in steps:
        for k in LOSSES:
            assert got[s][k] == pytest.approx(ref[s][k], abs=tol), (s, k, got[s][k], ref[s][k])


@pytest.fixture(scope="module")
def runs(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("electra")
    run_world(1, electra_rank, overrides(pubmed_prefix, root, "tp1", steps=STEPS))
    run_world(2, electra_rank, overrides(pubmed_prefix, root, "tp2", tp=2, steps=STEPS, every=2))
    ref = records(root / "tp1")
    assert sorted(ref) == list(range(1, STEPS + 1))
    # the optimizer really moved both networks
    assert abs(ref[STEPS]["generator_loss"] - ref[1]["generator_loss"]) > 1e-3
    assert abs(ref[STEPS]["discriminator_loss"] - ref[1]["discriminator_loss"]) > 1e-3
    return root, ref


def test_tp2_matches_tp1(runs):
    root, ref = runs
    _assert_same_losses(records(root / "tp2"), ref, range(1, STEPS + 1))


def test_checkpoint_holds_both_networks_and_resumes_at_tp1(runs, pubmed_prefix):
    from torch.distributed.checkpoint import FileSystemReader

    root, ref = runs
    ckpt = root / "tp2" / "checkpoints" / "iter_0000002"
    saved = set(FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata)
    for key in ("embedding.word_embeddings.weight", "embedding.layernorm.weight",
                "encoder.layers.self_attention.linear_qkv.weight", "encoder.layers.post_mlp_layernorm.weight",
                "discriminator_head.dense.weight", "discriminator_head.dense_prediction.bias",
                "generator.embeddings_project.weight", "generator.encoder.layers.self_attention.linear_qkv.weight",
                "generator.encoder.layers.post_attention_layernorm.bias", "generator.lm_head.dense.weight",
                "generator.lm_head.layer_norm.weight", "generator.output_layer.bias"):
        assert key in saved, key
        assert f"optimizer.state.exp_avg.{key}" in saved, key  # Adam state of both networks too
    # resharded TP2 -> TP1: the next steps are the uninterrupted TP1 run's
    run_world(1, electra_rank, overrides(pubmed_prefix, root, "resumed_tp1", steps=STEPS,
                                         extra=(f"exp_manager.resume_from_checkpoint={ckpt}",)))
    _assert_same_losses(records(root / "resumed_tp1"), ref, range(3, STEPS + 1))


def test_dp2_distributed_optimizer_matches_tp1_and_resumes(runs, pubmed_prefix):
    root, ref = runs
    run_world(2, electra_rank, overrides(pubmed_prefix, root, "dp2", distopt=True, steps=STEPS, every=2))
    _assert_same_losses(records(root / "dp2"), ref, range(1, STEPS + 1))
    ckpt = root / "dp2" / "checkpoints" / "iter_0000002"
    run_world(2, electra_rank, overrides(pubmed_prefix, root, "dp2_resumed", distopt=True, steps=STEPS,
                                         extra=(f"exp_manager.resume_from_checkpoint={ckpt}",)))
    _assert_same_losses(records(root / "dp2_resumed"), records(root / "dp2"), range(3, STEPS + 1), tol=1e-6)


def _finetuning_encoder_vs_discriminator(ckpt: str) -> dict:
    """Build the NER model as ``finetune`` does from ``ckpt`` and compare its encoder with the discriminator."""
    import torch

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.electra import build_electra_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.families.task import build_task_model
    from bio_megatron.formats.fill import load_into, task_padded_vocab
    from bio_megatron.formats.source import apply_source_shape, resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint

    init_distributed()
    init_model_parallel(1, 1, seed=3)
    src = resolve_source(ckpt)
    vocab = sum(1 for _ in open(src.vocab_file, encoding="utf-8"))
    m = ModelConfig()
    apply_source_shape(m, src)
    hidden = m.shape().hidden_size
    task = build_task_model(m, task_padded_vocab(m, vocab, src), torch.nn.Linear(hidden, 3), torch.float32, seed=3)
    before = {k: v.clone() for k, v in task.state_dict().items() if torch.is_tensor(v)}
    load_into(task, src, encoder_only=True)
    electra = build_electra_model(load_pretrain_config(Path(src.path) / "config.yaml").model, vocab)
    load_checkpoint(Path(src.path), electra, model_only=True)
    disc = electra.state_dict()
    encoder = {k: v for k, v in task.state_dict().items() if k.startswith(("embedding.", "encoder."))
               and torch.is_tensor(v)}
    return {"block_type": m.transformer_block_type, "keys": len(encoder), "missing": sorted(set(encoder) - set(disc)),
            "diff": max((v - disc[k]).abs().max().item() for k, v in encoder.items() if k in disc),
            "changed": min((v - before[k]).abs().max().item() for k, v in encoder.items())}


def test_finetuning_starts_from_the_discriminator(runs):
    root, _ = runs
    (got,) = run_world(1, _finetuning_encoder_vs_discriminator, str(root / "tp2" / "checkpoints"))
    assert got["block_type"] == "post_ln" and got["keys"] > 20 and not got["missing"], got
    assert got["diff"] == 0.0, got  # the discriminator's embedding and encoder, bit for bit
    assert got["changed"] > 0.0, got  # every weight matrix came from the checkpoint, none kept its fresh init


def _keys_and_counts() -> dict:
    import dataclasses

    from bio_megatron.config.family_keys import electra_parameter_count
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.models.bert import build_model
    from bio_megatron.models.electra import build_electra_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    m = ModelConfig(size="tiny", transformer_block_type="post_ln", objective="electra", generator_hidden_fraction=0.5)
    out = {"bert": [k for k in build_model(dataclasses.replace(m, objective="bert"), 1000).state_dict()
                    if not k.endswith("_extra_state")]}
    for name, fraction in (("electra", 0.5), ("same_width", 1.0)):
        mm = dataclasses.replace(m, generator_hidden_fraction=fraction)
        model = build_electra_model(mm, 1000)
        out[name] = [k for k in model.state_dict() if not k.endswith("_extra_state")]
        out[name + "_count"] = (sum(p.numel() for p in model.parameters()),
                                electra_parameter_count(mm, padded_vocab_size(1000)))
    return out


def test_state_dict_keys_and_parameter_count():
    (got,) = run_world(1, _keys_and_counts)
    bert, electra = set(got["bert"]), set(got["electra"])
    trunk = ("embedding.", "encoder.")
    assert {k for k in electra if k.startswith(trunk)} == {k for k in bert if k.startswith(trunk)}
    assert {k.removeprefix("generator.") for k in electra if k.startswith("generator.encoder.")} == \
        {k for k in bert if k.startswith("encoder.")}
    heads = {"discriminator_head.dense.weight", "discriminator_head.dense.bias",
             "discriminator_head.dense_prediction.weight", "discriminator_head.dense_prediction.bias",
             "generator.embeddings_project.weight", "generator.embeddings_project.bias",
             "generator.lm_head.dense.weight", "generator.lm_head.dense.bias", "generator.lm_head.layer_norm.weight",
             "generator.lm_head.layer_norm.bias", "generator.output_layer.bias"}
    assert {k for k in electra if not k.startswith(trunk) and not k.startswith("generator.encoder.")} == heads
    assert not any("embeddings_project" in k for k in got["same_width"])  # only when G != E, as HF
    real, formula = got["electra_count"]
    assert real == formula
    assert got["same_width_count"][0] == got["same_width_count"][1]


@pytest.mark.parametrize("over, needle", [
    (["model.pipeline_model_parallel_size=2"], "cannot send back to the first stage"),
    (["model.bert_binary_head=true"], "no next-sentence task"),
    (["model.transformer_block_type=pre_ln"], "model.transformer_block_type=post_ln"),
    (["model.generator_hidden_fraction=0"], "must be in (0, 1]"),
    (["model.generator_hidden_fraction=0.25", "model.tensor_model_parallel_size=2"], "generator heads (1"),
], ids=["pp2", "nsp", "pre_ln", "fraction", "heads_tp"])
def test_refusals_name_the_reason(over, needle):
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(RECIPE, over)
    assert needle in str(err.value)


def test_discriminator_learns_to_detect_replaced_tokens(pubmed_prefix, tmp_path):
    steps, window = 150, 30
    run_world(1, electra_rank, overrides(pubmed_prefix, tmp_path, "learn", steps=steps,
                                         extra=("model.micro_batch_size=8",)))
    recs = [r for s, r in sorted(records(tmp_path / "learn").items()) if s > steps - window]
    mean = lambda k: sum(r[k] for r in recs) / len(recs)  # noqa: E731
    replaced = mean("replaced_fraction")
    entropy = sum(-p * math.log(p) - (1 - p) * math.log(1 - p) for p in (r["replaced_fraction"] for r in recs))
    assert mean("discriminator_replaced_accuracy") > 0.05  # it catches replaced tokens ...
    assert mean("discriminator_accuracy") > 1 - replaced  # ... without giving up more originals than that
    assert mean("discriminator_loss") < entropy / len(recs)  # better than any constant guess of the base rate
