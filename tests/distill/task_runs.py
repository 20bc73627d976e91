"""Tiny task-specific distillation runs for tests/distill: a NER teacher fine-tuned a few steps on the BC5CDR-chem
slice, and what each forked rank runs (the real ``finetune`` path minus argument parsing)."""

from __future__ import annotations

import os
from pathlib import Path

from finetune.ft_runs import finetune_rank

ROOT = Path(__file__).resolve().parents[2]
TINY_NER_DISTILL = ROOT / "nemo_configs" / "distill" / "ner" / "tiny_ner_distill.yaml"
DATA = ROOT / "tests" / "fixtures" / "finetune"
QUICK = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "model.head.fc_dropout=0.0", "model.dataset.max_train_examples=64",
         "model.dataset.max_eval_examples=16", "model.dataset.test_file=null", "model.micro_batch_size=4",
         f"model.dataset.data_dir={DATA}"]
STUDENT = ["model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=2", "model.ffn_hidden_size=128"]


def run_overrides(root: Path, name: str, teacher: Path | None, *extra: str) -> list[str]:
    return [*QUICK, *STUDENT, f"exp_manager.exp_dir={root}", f"exp_manager.name={name}",
            *([f"model.teacher.restore_from_path={teacher}"] if teacher else []), *extra]


def make_ner_teacher(root: Path) -> Path:
    """The tiny_ner recipe (4 layers, hidden 64) fine-tuned 3 steps: its best checkpoint is the teacher."""
    from harness import run_world

    over = [*QUICK, f"exp_manager.exp_dir={root}", "exp_manager.name=ner_teacher"]
    (res,) = run_world(1, finetune_rank, "ner", over, timeout=300)
    return Path(res["checkpoint"])


def distil_and_record(over: list[str]) -> dict:
    """A task-distilled ``finetune ner`` that keeps, for its first micro-batches, what the loss read (student and
    teacher logits, labels) and gave; afterwards its teacher is compared with a fresh load of the checkpoint, and
    every optimizer step records the parameters it updates."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    import bio_megatron.tasks.distill as td
    from bio_megatron.config.finetune import load_finetune_config

    load, loss_fn, held, calls = td.load_task_teacher, td.task_distill_loss, {}, []

    def keep(*args, **kwargs):
        held["args"], held["teacher"] = (args, kwargs), load(*args, **kwargs)
        return held["teacher"]

    def record(kind, task_loss, student, teacher, batch, d):
        loss, report = loss_fn(kind, task_loss, student, teacher, batch, d)
        if len(calls) < 2:
            # plain lists: a tensor would cross to the parent through shared memory that dies with this rank
            calls.append({"kind": kind, "student": student.detach().tolist(), "teacher": teacher.detach().tolist(),
                          "labels": batch["labels"].tolist(), "loss": float(loss), "settings": vars(d).copy()})
        return loss, report

    td.load_task_teacher, td.task_distill_loss = keep, record
    stepped: set[int] = set()
    hook = register_optimizer_step_pre_hook(
        lambda opt, a, k: stepped.update(id(p) for g in opt.param_groups for p in g["params"]))
    try:
        os.chdir(ROOT)
        cfg = load_finetune_config("ner", TINY_NER_DISTILL, over, int(os.environ["WORLD_SIZE"]))
        from bio_megatron.tasks.finetune import run_finetuning

        res = run_finetuning(cfg)
    finally:
        hook.remove()
        td.load_task_teacher, td.task_distill_loss = load, loss_fn
    teacher = held["teacher"]
    fresh = load(*held["args"][0], **held["args"][1]).state_dict()
    after = teacher.state_dict()
    return {"losses": [h["loss"] for h in res["history"] if "loss" in h], "calls": calls, "dev": res["dev"],
            "teacher": {"identical": sorted(after) == sorted(fresh) and all(
                torch.equal(after[k], fresh[k]) for k in fresh if torch.is_tensor(fresh[k])),
                "no_grad": all(p.grad is None and not p.requires_grad for p in teacher.parameters()),
                "eval_mode": not any(mod.training for mod in teacher.modules()),
                "in_optimizer": sum(id(p) in stepped for p in teacher.parameters()), "stepped": len(stepped)}}


def distil_rank(over: list[str]) -> list[float]:
    """A task-distilled ``finetune ner`` rank: its per-step training losses."""
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    cfg = load_finetune_config("ner", TINY_NER_DISTILL, over, int(os.environ["WORLD_SIZE"]))
    return [h["loss"] for h in run_finetuning(cfg)["history"] if "loss" in h]


def cli(argv: list[str]) -> tuple[int, str]:
    from reliability.cli_log import run_cli

    os.chdir(ROOT)
    return run_cli(argv)
