"""The harness the family tests share (tests/families/test_{albert,modernbert}*.py).

Pretraining through the real path: one forked rank of ``bio-megatron pretrain --config RECIPE`` (the CLI path minus
argument parsing), a TP1 reference run with a mid-run checkpoint, other layouts' losses compared with it, a resume
from that checkpoint compared with it, and the config-time refusal of pipeline parallelism. HF parity: an imported
pretraining checkpoint's logits at a TP layout and fine-tuning's encoder against transformers' hidden states, and
an ``import hf`` refused in one line. Each family's test file keeps its own assertions on what these return."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from harness import run_world

from engine.pretrain_runs import losses, overrides

LAYOUTS = {"tp2": (2, 2, False), "dp2_distopt": (2, 1, True)}  # name: (world, tp, distributed optimizer)
PIPELINE_LAYOUTS = {"tp2pp2": (4, 2, False, 2)}  # name: (world, tp, distributed optimizer, pp): PP-capable families


def pretrain_rank(recipe: Path, over: list[str]) -> dict:
    """One forked rank of ``bio-megatron pretrain --config recipe`` with ``over``; the run's status."""
    import os

    import torch.distributed as dist

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    cfg = load_pretrain_config(recipe, over, world_size=int(os.environ["WORLD_SIZE"]))
    status = run_pretraining(cfg)
    dist.barrier()
    return {"status": status}


def reference_run(rank: Callable, pubmed_prefix: Path, root: Path, steps: int) -> dict[int, float]:
    """The TP1 run ``root/tp1`` of ``steps`` steps with a checkpoint at the middle: its losses, every step logged."""
    (res,) = run_world(1, rank, overrides(pubmed_prefix, root, "tp1", steps=steps, every=steps // 2))
    assert res["status"] == "finished"
    ref = losses(root / "tp1")
    assert sorted(ref) == list(range(1, steps + 1))
    return ref


def assert_layout_matches(rank: Callable, name: str, root: Path, ref: dict[int, float], pubmed_prefix: Path,
                          steps: int) -> None:
    """The run of layout ``name`` (LAYOUTS) gives the reference's loss at every step within 1e-5."""
    world, tp, distopt, *pp = {**LAYOUTS, **PIPELINE_LAYOUTS}[name]
    run_world(world, rank, overrides(pubmed_prefix, root, name, tp=tp, pp=pp[0] if pp else 1, distopt=distopt,
                                     steps=steps))
    got = losses(root / name)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (name, step, got, ref)


def assert_resumes_exactly(rank: Callable, root: Path, ref: dict[int, float], pubmed_prefix: Path,
                           steps: int, layout: str | None = None, tol: float = 1e-6) -> None:
    """The second half resumed from the reference's middle checkpoint (model, optimizer, scheduler, data position)
    gives the uninterrupted run's losses within ``tol``; at TP1, or resharded to ``layout`` (PIPELINE_LAYOUTS)."""
    middle = root / "tp1" / "checkpoints" / f"iter_{steps // 2:07d}"
    assert middle.is_dir(), sorted(p.name for p in middle.parent.iterdir())
    world, tp, distopt, pp = PIPELINE_LAYOUTS[layout] if layout else (1, 1, False, 1)
    name = f"resumed_{layout}" if layout else "resumed"
    over = overrides(pubmed_prefix, root, name, tp=tp, pp=pp, distopt=distopt, steps=steps,
                     extra=(f"exp_manager.resume_from_checkpoint={middle}",))
    assert all(r["status"] == "finished" for r in run_world(world, rank, over))
    got = losses(root / name)
    assert sorted(got) == list(range(steps // 2 + 1, steps + 1))
    for step in got:
        assert got[step] == pytest.approx(ref[step], abs=tol), (step, got, ref)


def pipeline_refusal(recipe: Path, tmp_path: Path) -> str:
    """``pretrain --config recipe model.pipeline_model_parallel_size=2 --dry-run`` through the CLI: exit 2 with one
    line naming the key, nothing written; that line."""
    from reliability.cli_log import run_cli

    out = tmp_path / "runs"
    rc, text = run_cli(["pretrain", "--config", str(recipe), "model.pipeline_model_parallel_size=2",
                        f"exp_manager.exp_dir={out}", "--dry-run"], sep="\n")
    assert rc == 2, text
    line = [ln for ln in text.splitlines() if "pipeline_model_parallel_size" in ln]
    assert len(line) == 1, text
    assert not out.exists()
    return line[0]


def our_logits(ckpt: str, tp: int, batch: tuple, shape: dict | None = None) -> dict | None:
    """The imported pretraining checkpoint at TP ``tp`` (dist-checkpointing reshards it) on ``batch`` (the model's
    positional inputs): MLM logits gathered over TP and the binary head's logits (None without one), on TP rank 0
    (None elsewhere). ``shape`` adds ModelConfig fields (``{"bert_binary_head": True}``)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from architectures.hf_parity import vocab_lines
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.families import family_of_model
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.checkpoint import load_checkpoint

    init_distributed()
    init_model_parallel(tp, 1, seed=1)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, tensor_model_parallel_size=tp, transformer_impl="local", hidden_dropout=0.0,
                    attention_dropout=0.0, **(shape or {}))
    m.make_vocab_size_divisible_by = src.padded_vocab // tp  # the saved padding, sharded over TP
    vocab = vocab_lines(src.vocab_file)
    model = family_of_model(m).build_pretraining_model(m, vocab, torch.float32).eval()
    load_checkpoint(src.path, model, model_only=True)
    with torch.no_grad():
        logits, binary = model(*batch)
        logits = gather_from_tensor_model_parallel_region(logits)
    if ps.get_tensor_model_parallel_rank():
        return None
    return {"family": src.shape["family"], "mlm": logits[..., :vocab].numpy(),
            "binary": None if binary is None else binary.numpy(),
            "padded_max": logits[..., vocab:].max().item(), "type": type(model).__name__}


def encoder_hidden(path: str, ids, amask, types, theirs) -> float:
    """Fine-tuning's encoder (TaskModel through the family's task_encoder, identity head) filled from ``path``:
    max |ours - ``theirs``| over the real positions, in a fresh TP1 world."""
    import torch

    from architectures.hf_parity import encoder_hidden_diff
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    return encoder_hidden_diff(path, ids, amask, types, torch.from_numpy(theirs))


def import_refusal(write: Callable[[str], None], tmp_path: Path) -> str:
    """``write`` makes the HF folder ``tmp_path/hf``; ``import hf`` of it through the CLI exits 2 with one line,
    writes nothing at --out and leaves the folder as it was; that line."""
    from reliability.cli_log import run_cli
    from reliability.files import tree_digest

    run_world(1, write, str(tmp_path / "hf"))
    before = tree_digest(tmp_path / "hf")
    rc, text = run_cli(["import", "hf", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], sep="\n")
    assert rc == 2 and len(text.splitlines()) == 1, text
    assert not (tmp_path / "out").exists() and tree_digest(tmp_path / "hf") == before
    return text
