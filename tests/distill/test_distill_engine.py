"""``bio-megatron distill`` on the engine: TP2 = TP1 and DP2 + distributed optimizer = TP1 (losses and each term per
step within 1e-5, dropout off), the teacher untouched (bit-identical, no gradients, never in the optimizer), an
exact resume, each loss term in metrics.jsonl, and the saved student an ordinary checkpoint of its family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from distill_runs import distill_overrides, distill_rank, losses
from harness import run_world

TERMS = ("loss", "mlm_loss", "kl_loss", "cos_loss")


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


@pytest.fixture(scope="module")
def runs(pubmed_prefix, distill_teacher, tmp_path_factory) -> dict:
    """The teacher and one TP1 distillation of 4 steps with a save every 2 (reused by every test here)."""
    root, teacher = tmp_path_factory.mktemp("distill"), distill_teacher
    over = distill_overrides(pubmed_prefix, root, "tp1", teacher, steps=4, every=2, save_last=True)
    assert run_world(1, distill_rank, over) == ["finished"]
    return {"root": root, "teacher": teacher, "prefix": pubmed_prefix, "tp1": root / "tp1"}


def _compare(a: dict[int, dict], b: dict[int, dict]) -> list[str]:
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    return [f"step {s} {k}: {a[s][k]} vs {b[s][k]}" for s in a for k in TERMS if abs(a[s][k] - b[s][k]) > 1e-5]


def test_each_term_is_logged_and_the_loss_is_their_weighted_sum(runs) -> None:
    recs = _records(runs["tp1"])
    for r in recs.values():
        assert r["kl_loss"] > 0 and r["cos_loss"] > 0 and r["mlm_loss"] > 0
        assert r["loss"] == pytest.approx(5.0 * r["mlm_loss"] + 2.0 * r["kl_loss"] + 1.0 * r["cos_loss"], rel=1e-5)


@pytest.mark.parametrize("layout", ["tp2", "dp2_distopt"])
def test_other_layouts_equal_tp1(runs, layout: str) -> None:
    tp, distopt = (2, False) if layout == "tp2" else (1, True)
    over = distill_overrides(runs["prefix"], runs["root"], layout, runs["teacher"], tp=tp, distopt=distopt, steps=4)
    assert run_world(2, distill_rank, over) == ["finished", "finished"]
    assert _compare(_records(runs["tp1"]), _records(runs["root"] / layout)) == []


def test_resume_after_a_save_equals_the_uninterrupted_run(runs) -> None:
    """As if killed after the save at step 2: the newer checkpoint removed, the same command resumes from step 2."""
    run = runs["root"] / "resumed"
    shutil.copytree(runs["tp1"], run)
    shutil.rmtree(run / "checkpoints" / "iter_0000004")
    (run / "checkpoints" / "latest").write_text("2\n")
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in (run / "metrics.jsonl").read_text()
                                               .splitlines() if json.loads(line)["step"] <= 2))
    over = distill_overrides(runs["prefix"], runs["root"], "resumed", runs["teacher"], steps=4, every=2,
                             save_last=True)
    assert run_world(1, distill_rank, over) == ["finished"]
    assert losses(run) == pytest.approx(losses(runs["tp1"]), abs=1e-6)
    assert _compare(_records(runs["tp1"]), _records(run)) == []


def _teacher_untouched(over: list[str], teacher_dir: str) -> dict:
    """A distillation whose teacher is compared, after training, with a fresh load of its checkpoint; every
    optimizer step records the parameters it updates."""
    import os

    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from bio_megatron.config.distill import load_distill_config
    from bio_megatron.loading.teacher import load_teacher
    from bio_megatron.training.distill import run_distillation
    from distill_runs import TINY_DISTILL

    cfg = load_distill_config(TINY_DISTILL, over, world_size=int(os.environ["WORLD_SIZE"]))
    held: dict = {}

    def keep(*args):
        held["teacher"] = load_teacher(*args)
        return held["teacher"]

    stepped: set[int] = set()
    hook = register_optimizer_step_pre_hook(
        lambda opt, a, k: stepped.update(id(p) for g in opt.param_groups for p in g["params"]))
    try:
        assert run_distillation(cfg, load_teacher=keep) == "finished"
    finally:
        hook.remove()
    teacher = held["teacher"]
    fresh = load_teacher(cfg, *_vocab(cfg), cfg.trainer.precision)
    after, before = teacher.state_dict(), fresh.state_dict()
    return {"identical": all(torch.equal(after[k], before[k]) for k in before if torch.is_tensor(before[k])),
            "same_keys": sorted(after) == sorted(before),
            "no_grad": all(p.grad is None and not p.requires_grad for p in teacher.parameters()),
            "in_optimizer": sum(id(p) in stepped for p in teacher.parameters()), "stepped": len(stepped)}


def _vocab(cfg):
    from bio_megatron.data.pretrain import load_tokenizer

    tok = load_tokenizer(cfg)
    return tok.vocab_file, tok.vocab_size


def test_teacher_is_bit_identical_after_training_and_never_in_the_optimizer(runs) -> None:
    over = distill_overrides(runs["prefix"], runs["root"], "frozen", runs["teacher"], steps=2)
    (r,) = run_world(1, _teacher_untouched, over, str(runs["teacher"]))
    assert r == {"identical": True, "same_keys": True, "no_grad": True, "in_optimizer": 0, "stepped": r["stepped"]}
    assert r["stepped"] > 0


def _cli(argv: list[str]) -> tuple[int, str]:
    from reliability.cli_log import run_cli

    return run_cli(argv)


def test_saved_student_is_an_ordinary_checkpoint_of_its_family(runs, tmp_path) -> None:
    """export hf reads it as any pretraining checkpoint (its own keys; the projection is left out)."""
    out = tmp_path / "hf"
    (rc, msg), = run_world(1, _cli, ["export", "hf", "--checkpoint", str(runs["tp1"]), "--out", str(out)])
    assert rc == 0, msg
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (32, 2)
    meta = json.loads((runs["tp1"] / "checkpoints" / "iter_0000004" / "bio_megatron.json").read_text())
    assert meta["family"] == "megatron_bert" and meta["distilled_from"] == str(runs["teacher"])


@pytest.fixture(scope="module")
def hf_teacher(runs, tmp_path_factory) -> Path:
    """The teacher exported to a Hugging Face folder (MegatronBertForMaskedLM)."""
    hf = tmp_path_factory.mktemp("hf") / "teacher_hf"
    (rc, msg), = run_world(1, _cli, ["export", "hf", "--checkpoint", str(runs["teacher"]), "--out", str(hf)])
    assert rc == 0, msg
    return hf


def test_a_hugging_face_teacher_teaches_as_its_checkpoint(runs, hf_teacher) -> None:
    """The HF folder read back by loading/: the same losses, term by term, as with the checkpoint it came from."""
    hf = hf_teacher
    over = distill_overrides(runs["prefix"], runs["root"], "hf_teacher", hf, steps=2)
    assert run_world(1, distill_rank, over) == ["finished"]
    ours, theirs = _records(runs["tp1"]), _records(runs["root"] / "hf_teacher")
    assert [(s, k) for s in (1, 2) for k in TERMS if abs(ours[s][k] - theirs[s][k]) > 1e-5] == []


def test_a_teacher_with_nan_weights_stops_the_run_as_pretraining_diverges(runs, hf_teacher, tmp_path) -> None:
    """The NaN guard is pretraining's: every step is skipped, the run stops with exit 3 and status.json "failed"."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan_teacher"
    shutil.copytree(hf_teacher, bad)
    weights = next(bad.glob("*.safetensors"))
    state = load_file(str(weights))
    name = next(k for k in state if "word_embeddings" in k)
    state[name][5] = float("nan")
    state[name][[0, 101, 102, 103]] = float("nan")  # [PAD], [CLS], [SEP], [MASK]: every sequence reads one
    save_file(state, str(weights), metadata={"format": "pt"})
    over = distill_overrides(runs["prefix"], tmp_path, "nan", bad, steps=4, extra=("trainer.max_nonfinite_steps=2",))
    from distill_runs import TINY_DISTILL

    (rc, msg), = run_world(1, _cli, ["distill", "--config", str(TINY_DISTILL), *over])
    assert rc == 3, msg
    assert json.loads((tmp_path / "nan" / "status.json").read_text())["state"] == "failed"
    assert [r.get("nonfinite") for r in _records(tmp_path / "nan").values()] == [True, True]


def _cli_warnings(argv: list[str]) -> tuple[int, str]:
    import logging

    from reliability.cli_log import run_cli

    return run_cli(argv, level=logging.WARNING)


def test_a_resumed_run_with_another_loss_says_so(runs, tmp_path) -> None:
    shutil.copytree(runs["tp1"], tmp_path / "again")
    over = distill_overrides(runs["prefix"], tmp_path, "again", runs["teacher"], steps=4,
                             extra=("model.distill.alpha_cos=0.5",))
    from distill_runs import TINY_DISTILL

    (rc, msg), = run_world(1, _cli_warnings, ["distill", "--config", str(TINY_DISTILL), *over])
    assert rc == 0, msg
    assert "model.distill.alpha_cos is 0.5 in this run, 1.0 in the checkpoint" in msg
