"""Activation recomputation (``model.activations_checkpoint_*``) through megatron-core's
own recompute: the same gradients as without it, with dropout on, at TP2.

Each world builds the same seeded tiny model once per setting and runs one training micro-batch (megatron's
schedule, the pretraining ``forward_step``) from the same RNG state. Recompute replays the forward of the
recomputed parts in the backward pass; with dropout on, that replay must draw the same masks as the first pass
(megatron's ``CheckpointFunction`` restores the CPU, "CUDA" and model-parallel tracker states, which the CPU
shim maps to the CPU generator; at TP2 the unfused attention's dropout runs in the tracker's fork, and with
sequence parallelism the whole block does). A wrong replay changes the gradients: a control run with another
seed shows that the dropout masks do reach them. Forward-call counts show what was recomputed: a layer, its core
attention runs twice in a step exactly where recompute applies (selective: every layer's core attention; full
uniform: every layer; full block N: the first N layers).
"""

from __future__ import annotations

import pytest
import torch
from harness import run_world

VOCAB, SEQ, MICRO = 1000, 16, 2
FULL = "activations_checkpoint_granularity"
SETTINGS = {  # name: ModelConfig keys
    "none": {},
    "selective": {FULL: "selective"},  # every layer's core attention
    "selective_uniform": {FULL: "selective", "activations_checkpoint_method": "uniform"},  # NeMo's spelling of it
    "full_uniform_1": {FULL: "full", "activations_checkpoint_method": "uniform",
                       "activations_checkpoint_num_layers": 1},
    "full_uniform_2": {FULL: "full", "activations_checkpoint_method": "uniform",
                       "activations_checkpoint_num_layers": 2},
    "full_block_1": {FULL: "full", "activations_checkpoint_method": "block", "activations_checkpoint_num_layers": 1},
    "full_block_3": {FULL: "full", "activations_checkpoint_method": "block", "activations_checkpoint_num_layers": 3},
}
LAYERS = 4  # the tiny size


def _batch(electra: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    b = {"text": torch.randint(5, VOCAB, (MICRO, SEQ), generator=g), "types": torch.zeros(MICRO, SEQ, dtype=torch.long),
         "labels": torch.randint(5, VOCAB, (MICRO, SEQ), generator=g),
         "loss_mask": (torch.rand(MICRO, SEQ, generator=g) < 0.3).long(),
         "padding_mask": torch.ones(MICRO, SEQ, dtype=torch.long)}
    b["padding_mask"][1, -3:] = 0
    if electra:
        b["sample_index"] = torch.arange(MICRO)
    return b


def _counted(model: torch.nn.Module) -> dict[str, int]:
    """Forward calls of each layer of the (discriminator's) encoder and of its core attention and MLP, counted by
    hooks ("<layer>.<part>" -> calls)."""
    counts: dict[str, int] = {}

    def hook(name):
        def h(*_):
            counts[name] = counts.get(name, 0) + 1
        return h

    for i, layer in enumerate(model.encoder.layers):
        for part, mod in (("layer", layer), ("core_attention", layer.self_attention.core_attention),
                          ("mlp", layer.mlp)):
            mod.register_forward_hook(hook(f"{i}.{part}"))
    return counts


def _grads(tp: int, block_type: str, objective: str, settings: dict[str, dict], seed_of: dict[str, int]) -> dict:
    from functools import partial

    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig, validate
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.pretrain import build_stage, electra_forward_step, forward_step

    init_distributed()
    init_model_parallel(tp, 1, seed=7)
    electra = objective == "electra"
    out: dict = {}
    for name, keys in settings.items():
        cfg = PretrainConfig()
        cfg.trainer.seed = 1234
        cfg.exp_manager.exp_dir = "/tmp"
        cfg.model = ModelConfig(size="tiny", encoder_seq_length=SEQ, max_position_embeddings=64, micro_batch_size=MICRO,
                                global_batch_size=MICRO, tensor_model_parallel_size=tp, objective=objective,
                                hidden_dropout=0.1, attention_dropout=0.1, transformer_block_type=block_type,
                                generator_hidden_fraction=0.5, **keys)  # (a generator with 2 heads for TP2)
        validate(cfg)  # the settings are valid ones
        model, ddp = build_stage(cfg, VOCAB, torch.float32)
        counts = _counted(model)
        seed = seed_of.get(name, 99)
        torch.manual_seed(seed)  # the same dropout streams for every setting (the control takes another)
        model_parallel_cuda_manual_seed(seed)
        step = (partial(electra_forward_step, seed=1234, weight=50.0) if electra
                else partial(forward_step, binary_head=False))
        ddp.zero_grad_buffer()
        losses = get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter([_batch(electra)]), model=[ddp], num_microbatches=1,
            seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        ddp.finish_grad_sync()
        out[name] = {"loss": float(losses[0]["loss"]), "counts": dict(counts),
                     "recompute": model.config.recompute_granularity,
                     "grads": {n: p.main_grad.detach().clone() for n, p in model.named_parameters()}}
    # Compared here: the gradients stay in the rank, its verdicts go back.
    ref = out["none"]["grads"]
    for res in out.values():
        grads = res.pop("grads")
        res["differ"] = sorted(k for k, g in ref.items() if not torch.equal(grads[k], g))
        res["max_diff"] = max(float((grads[k] - g).abs().max()) for k, g in ref.items())
    return out


def _expected_calls(keys: dict) -> dict[str, int]:
    """How often each layer and part runs in one step under a setting: twice where it is recomputed."""
    calls = {}
    selective = keys.get(FULL) == "selective"
    for i in range(LAYERS):
        layer = 1
        if keys.get(FULL) == "full":
            n = keys["activations_checkpoint_num_layers"]
            layer = 2 if keys["activations_checkpoint_method"] == "uniform" or i < n else 1
        calls[f"{i}.layer"] = layer
        calls[f"{i}.core_attention"] = layer + selective
        calls[f"{i}.mlp"] = layer
    return calls


def _check(results: list[dict], settings: dict[str, dict]) -> None:
    """Every setting's loss and gradients equal those without recompute, bit for bit, on every rank."""
    for rank, res in enumerate(results):
        ref = res["none"]
        assert res["control"]["loss"] != ref["loss"], "dropout has no effect: the test could not see a wrong mask"
        assert res["control"]["differ"], "another dropout seed left every gradient unchanged"
        for name, keys in settings.items():
            if name == "control":
                continue
            got = res[name]
            assert got["recompute"] == keys.get(FULL), name
            assert got["counts"] == _expected_calls(keys), (name, got["counts"])
            assert got["loss"] == ref["loss"], (rank, name, got["loss"], ref["loss"])
            assert not got["differ"], (rank, name, got["max_diff"], got["differ"])


@pytest.mark.parametrize("block_type", ["pre_ln", "post_ln"])
def test_recompute_gradients_equal_with_dropout_at_tp2(block_type):
    settings = SETTINGS | {"control": {}}
    _check(run_world(2, _grads, 2, block_type, "bert", settings, {"control": 5}), settings)


def test_recompute_gradients_equal_with_sequence_parallelism():
    """With sequence parallelism the whole block runs inside the model-parallel RNG fork: the replay must restore
    the tracker's state there too."""
    sp = {"sequence_parallel": True}
    settings = {n: SETTINGS[n] | sp for n in ("none", "selective", "full_uniform_1", "full_block_1")}
    settings["control"] = sp
    _check(run_world(2, _grads, 2, "post_ln", "bert", settings, {"control": 5}), settings)


def test_recompute_gradients_equal_for_electra_at_tp2():
    """ELECTRA's generator and discriminator both take the setting (the discriminator's layers are counted)."""
    settings = {n: SETTINGS[n] for n in ("none", "selective", "full_uniform_1", "full_block_1")} | {"control": {}}
    _check(run_world(2, _grads, 2, "post_ln", "electra", settings, {"control": 5}), settings)


def test_nemo_recompute_and_sequence_parallel_keys_take_effect_in_dry_run(capsys):
    """NeMo's own megatron_bert_config.yaml with its recompute / sequence-parallel keys set: the values reach the
    resolved config under the same names (Megatron-LM's spellings too), and the one no-effect warning no longer
    lists them."""
    import logging

    from config.test_nemo_configs import NEMO, _run, _warnings

    rc, out, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                             "model.activations_checkpoint_granularity=full",
                             "model.activations_checkpoint_method=block", "model.activations_checkpoint_num_layers=3",
                             "model.sequence_parallel=true", "model.tensor_model_parallel_size=2"], capsys)
    assert rc == 0, [r.getMessage() for r in records]
    m = out["config"]["model"]
    assert (m["activations_checkpoint_granularity"], m["activations_checkpoint_method"],
            m["activations_checkpoint_num_layers"], m["sequence_parallel"]) == ("full", "block", 3, True)
    warned = "\n".join(_warnings(records))
    assert "num_micro_batches_with_partial_activation_checkpoints" in warned  # still listed, with its reason
    listed = {k.strip() for line in warned.splitlines() if line.strip().startswith("- ")
              for k in line.strip()[2:].split(": ")[0].split(",")}
    assert "model.onnx_safe" in listed  # (the list is read right)
    for key in ("activations_checkpoint_granularity", "activations_checkpoint_method",
                "activations_checkpoint_num_layers", "sequence_parallel"):
        assert f"model.{key}" not in listed, warned
    rc, out, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                             "model.recompute_granularity=selective"], capsys)  # Megatron-LM's spelling
    assert rc == 0 and out["config"]["model"]["activations_checkpoint_granularity"] == "selective"
    # A bad combination is one line per problem, quoting the values, exit 2 before anything is built.
    rc, out, records = _run(["pretrain", "--config", str(NEMO / "megatron_bert_config.yaml"), "--dry-run",
                             "model.activations_checkpoint_granularity=full", "model.sequence_parallel=true",
                             "model.activations_checkpoint_num_layers=13"], capsys)
    errors = " | ".join(r.getMessage() for r in records if r.levelno >= logging.ERROR)
    assert rc == 2 and out is None, errors
    for expected in ("model.activations_checkpoint_granularity (full) needs model.activations_checkpoint_method",
                     "model.activations_checkpoint_num_layers (13) must be between 1 and the 12 layers",
                     "model.sequence_parallel (true) needs model.tensor_model_parallel_size >= 2 (got 1)"):
        assert expected in errors, errors


def _peak_step_memory(settings: dict[str, dict]) -> dict[str, dict]:
    """Peak RSS growth of one training step (after a warm-up step) of a model whose activations dominate its
    memory (hidden 256, 8 layers, seq 512, micro-batch 8; a small vocabulary), per setting, in this process."""
    import ctypes
    import time
    from functools import partial

    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.pretrain import build_stage, forward_step

    # Large blocks from mmap, returned to the kernel when freed: RSS then follows what is alive, and a block freed
    # by one setting's step is not reused by the next one's without showing up in its peak.
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD (fixed, no dynamic raise)
    init_distributed()
    init_model_parallel(1, 1, seed=7)
    seq, micro = 512, 8
    g = torch.Generator().manual_seed(3)
    batch = {"text": torch.randint(5, VOCAB, (micro, seq), generator=g), "types": torch.zeros(micro, seq, dtype=torch.long),
             "labels": torch.randint(5, VOCAB, (micro, seq), generator=g),
             "loss_mask": (torch.rand(micro, seq, generator=g) < 0.15).long(),
             "padding_mask": torch.ones(micro, seq, dtype=torch.long)}

    def status(key: str) -> int:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))

    out = {}
    for name, keys in settings.items():
        cfg = PretrainConfig()
        cfg.model = ModelConfig(size="tiny", hidden_size=256, num_layers=8, num_attention_heads=4, ffn_hidden_size=1024,
                                encoder_seq_length=seq, max_position_embeddings=seq, micro_batch_size=micro,
                                global_batch_size=micro, **keys)
        model, ddp = build_stage(cfg, VOCAB, torch.float32)
        run = partial(get_forward_backward_func(), forward_step_func=partial(forward_step, binary_head=False),
                      model=[ddp], num_microbatches=1, seq_length=seq, micro_batch_size=micro, forward_only=False)
        run(data_iterator=iter([batch]))  # warm-up: gradient buffers, allocator pools
        before = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current RSS
        t0 = time.perf_counter()
        run(data_iterator=iter([batch]))
        out[name] = {"peak_growth": status("VmHWM") - before, "seconds": time.perf_counter() - t0}
        del model, ddp, run
    return out


@pytest.mark.extended  # two steps per setting at seq 512 x 8: about a minute on one core (make test-extended)
def test_recompute_lowers_the_peak_memory_of_a_step():
    settings = {"none": {}, "selective": SETTINGS["selective"],
                "full_uniform_1": SETTINGS["full_uniform_1"] | {"activations_checkpoint_num_layers": 1}}
    res = run_world(1, _peak_step_memory, settings, timeout=600)[0]
    mib = {k: round(v["peak_growth"] / 2**20) for k, v in res.items()}
    print("peak RSS growth of one step (MiB):", mib, "seconds:", {k: round(v["seconds"], 1) for k, v in res.items()})
    assert mib["none"] > 200, mib  # activations dominate at this shape
    assert mib["selective"] < 0.8 * mib["none"], mib
    assert mib["full_uniform_1"] < 0.5 * mib["none"], mib


def _finetune_counting_checkpoints(task: str, over: list[str]) -> tuple[list[float], int]:
    """A fine-tuning run's losses and how many times megatron's recompute checkpoint was entered."""
    from megatron.core import tensor_parallel

    from finetune.ft_runs import finetune_rank

    calls, inner = [0], tensor_parallel.checkpoint

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    tensor_parallel.checkpoint = counted
    return finetune_rank(task, over)["losses"], calls[0]


def test_finetuning_takes_recompute_with_the_same_losses(tmp_path):
    """Fine-tuning builds its encoder from the same config: full and selective recompute (they do run: megatron's
    checkpoint is entered) give the losses of a run without it (NER, 3 steps, encoder dropout on)."""
    quick = ["trainer.max_steps=3", "model.hidden_dropout=0.1", "model.attention_dropout=0.1",
             "model.dataset.max_eval_examples=8", "model.dataset.test_file=null", "trainer.val_check_interval=3",
             "model.micro_batch_size=4", f"exp_manager.exp_dir={tmp_path}"]
    runs = {name: run_world(1, _finetune_counting_checkpoints, "ner", [*quick, f"exp_manager.name={name}", *keys])[0]
            for name, keys in (("none", []), ("full", ["model.activations_checkpoint_granularity=full",
                                                       "model.activations_checkpoint_method=uniform",
                                                       "model.activations_checkpoint_num_layers=1"]),
                               ("selective", ["model.activations_checkpoint_granularity=selective"]))}
    (ref, none_calls), (full, full_calls), (selective, selective_calls) = runs["none"], runs["full"], runs["selective"]
    assert len(ref) == 3 and none_calls == 0
    assert full_calls > 0 and selective_calls > 0, runs
    assert full == ref and selective == ref, runs


def _pretrain_counting_checkpoints(over: list[str]) -> int:
    """``pretrain_rank``, returning how many times megatron's recompute checkpoint was entered."""
    from megatron.core import tensor_parallel

    from engine.pretrain_runs import pretrain_rank

    calls, inner = [0], tensor_parallel.checkpoint

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    tensor_parallel.checkpoint = counted
    pretrain_rank(over)
    return calls[0]


def test_recompute_under_the_pipeline_schedule_matches_tp1(tmp_path, pubmed_prefix):
    """Block recompute counts layers per pipeline stage: TP2 x PP2 (two micro-batches per step through 1F1B) with
    the first layer of each stage recomputed trains like TP1 without recompute (dropout off, 3 steps)."""
    from engine.pretrain_runs import losses, overrides, pretrain_rank

    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "tp1", steps=3))
    checkpoints = run_world(4, _pretrain_counting_checkpoints, overrides(
        pubmed_prefix, tmp_path, "tp2pp2", tp=2, pp=2, steps=3, extra=(
            "model.activations_checkpoint_granularity=full", "model.activations_checkpoint_method=block",
            "model.activations_checkpoint_num_layers=1")))
    assert min(checkpoints) > 0, checkpoints  # every stage recomputed its first layer
    ref, got = losses(tmp_path / "tp1"), losses(tmp_path / "tp2pp2")
    assert sorted(ref) == sorted(got) == [1, 2, 3]
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (step, got, ref)
