"""The two sides of ``bench finetune``'s step benchmark, each built in a process of its own
(:mod:`bio_megatron.bench.side_process`): ours as ``bio-megatron finetune`` builds it (``tasks.finetune.setup``,
``tasks.finetune_steps.Batches``, ``training.loop.train_step``), and transformers' ``AutoModelFor...Classification``
with ``torch.optim.AdamW(fused=True)`` on our batches. ``worker`` is the process's target."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bio_megatron.bench.side_process import serve


def recipe(task: str) -> Path:
    from bio_megatron.config.recipes import find_recipe

    return find_recipe(task, "_base")


def _ours_side(spec: dict) -> tuple[Any, list]:
    """Our fine-tuning stack as ``finetune`` builds it; a step function and the batches of steps 0..n-1."""
    from functools import partial

    import torch

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import setup
    from bio_megatron.tasks.finetune_steps import Batches, forward_step
    from bio_megatron.training.loop import LoopState, train_step
    from bio_megatron.training.optimizer import build_optimizer, build_scheduler

    cfg = load_finetune_config(spec["task"], recipe(spec["task"]), spec["overrides"], 1)
    m, t = cfg.model, cfg.trainer
    _, _, task, _, ddp, dtype, _ = setup(cfg)
    batches = Batches(task, cfg)
    optimizer = build_optimizer(m.optim, [ddp], dtype, t.gradient_clip_val, m.use_distributed_optimizer, m)
    state = LoopState(model=ddp, optimizer=optimizer, scheduler=build_scheduler(optimizer, m.optim, 1000),
                      forward_step=partial(forward_step, task=task, keep_outputs=False), train_batches=batches.train,
                      valid_batches=lambda k: [], seq_length=m.dataset.max_seq_length,
                      micro_batch_size=m.micro_batch_size, max_steps=1000, max_nonfinite_steps=t.max_nonfinite_steps)
    batches.state = state
    plan = [batches.train(i) for i in range(spec["total"])]

    def step(i: int) -> float:
        t0 = time.perf_counter()
        state.step = i
        train_step(state)
        if torch.cuda.is_available():  # the optimizer's last kernels are still queued: timed as the HF side's
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step, plan


def _hf_side(spec: dict, get_plan) -> Any:
    """The baseline model and optimizer, then our batches (``get_plan``: they come once ours is built)."""
    import torch
    import transformers

    auto = (transformers.AutoModelForTokenClassification if spec["task"] == "ner"
            else transformers.AutoModelForSequenceClassification)
    # on the device ours trains on: a GPU run compared with a CPU baseline would measure the device, not the code
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = auto.from_pretrained(spec["folder"]).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0, fused=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec["precision"] == "bf16")
    label_key = "labels" if spec["task"] == "ner" else "label"
    plan = get_plan()  # packed or not, a batch keeps the task's own padded keys: those are what HF trains on
    hf_plan = [[{"input_ids": b["input_ids"].to(device), "attention_mask": b["attention_mask"].to(device),
                 "token_type_ids": b["tokentype_ids"].to(device), "labels": b[label_key].to(device)} for b in micro]
               for micro in plan]

    def step(i: int) -> float:
        t0 = time.perf_counter()
        micro = hf_plan[i]
        for b in micro:
            with autocast:
                loss = model(**b).loss
            (loss / len(micro)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":  # kernels run asynchronously: the step ends when they do (ours reads its loss)
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step


def worker(conn, side: str, spec: dict, threads: int) -> None:
    """Build one side and report ready (ours: with its batches; the baseline waits for them first), then run step
    ``i`` per request."""
    def build() -> tuple[Any, Any]:
        import torch

        torch.set_num_threads(threads)
        if side == "hf":
            return _hf_side(spec, conn.recv), None
        from bio_megatron.parallel.seam import import_megatron_core

        import_megatron_core()  # as `finetune` starts: without Inductor's and wandb's imports
        return _ours_side(spec)

    serve(conn, build, finish=_teardown if side == "ours" else None)


def _teardown() -> None:
    from bio_megatron.parallel.distributed import teardown

    teardown()
