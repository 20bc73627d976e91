"""PyTorch Lightning 1.x trainer keys in NeMo 1.0-1.23 configs that have a meaning here, mapped to ours.

NeMo 1.x example configs carry Lightning 1.x's trainer: ``gpus`` (now ``devices``), ``max_steps: null`` (no step
limit: the run ends after ``max_epochs``), ``accelerator: ddp`` (Lightning 1.x's strategy slot) and
``resume_from_checkpoint`` (NeMo's exp_manager moves it to its own key, as here). The Lightning 1.x keys without a
meaning here are listed, each with its reason, in ``nemo_keys.NO_EFFECT``: the one list of such keys.
"""

from __future__ import annotations

from typing import Any

from bio_megatron.config.nemo_doc import NemoDoc

# (nemo_keys.NO_EFFECT gives this reason for trainer.strategy and Lightning 1.x's names of it)
STRATEGY = ("the parallel layout is megatron-core's: model.tensor_model_parallel_size, "
            "model.pipeline_model_parallel_size and the launch")
# Lightning 1.x put the strategy under trainer.accelerator (NeMo 1.0-1.7: ``accelerator: ddp``).
PL1_STRATEGIES = ("ddp", "ddp_spawn", "ddp2", "dp", "ddp_cpu", "ddp_sharded", "horovod", "deepspeed")

LIGHTNING1_KEYS = ("trainer.gpus", "trainer.max_steps", "trainer.max_epochs", "trainer.accelerator",
                   "trainer.resume_from_checkpoint")


def _gpu_count(v: Any) -> int | str | None:
    """Lightning 1.x ``gpus``: a count, a list of ids, ``"0,1"`` (ids), -1 (all), or 0/null (the CPU: None)."""
    if isinstance(v, str):
        v = v.strip()
        v = int(v) if v.lstrip("-").isdigit() else [x for x in v.split(",") if x.strip()]
    if isinstance(v, (list, tuple)):
        return len(v) or None
    return "auto" if v == -1 else (v or None)


def lightning1(d: NemoDoc, task: str) -> None:
    """PyTorch Lightning 1.x trainer keys of NeMo 1.x configs that have a meaning here, mapped to ours."""
    if "trainer.gpus" in d.flat:
        n = _gpu_count(d.pop("trainer.gpus"))
        if n is None:  # Lightning: gpus 0 or null trains on the CPU
            d.set("trainer.accelerator", "cpu", "trainer.gpus")
        else:
            d.set("trainer.devices", n, "trainer.gpus")
    if "trainer.accelerator" in d.flat:
        v = d.pop("trainer.accelerator")
        if v in PL1_STRATEGIES:  # Lightning 1.x's strategy slot, not a device type
            d.ignored["trainer.accelerator"] = f"{v!r} is Lightning 1.x's strategy name: {STRATEGY}"
        elif v is not None:
            d.set("trainer.accelerator", v, "trainer.accelerator")
    if d.flat.get("trainer.resume_from_checkpoint") is not None:
        path = str(d.pop("trainer.resume_from_checkpoint"))
        if path.endswith((".ckpt", ".nemo")):
            d.problems.append(f"trainer.resume_from_checkpoint ({path}) is a Lightning/NeMo file: a run resumes here "
                              "from this project's checkpoint directories only; start from its weights with "
                              "`bio-megatron import nemo` and model.restore_from_path")
        else:  # NeMo's exp_manager moves it there too; fine-tuning's validation refuses it with the reason
            d.set("exp_manager.resume_from_checkpoint", path, "trainer.resume_from_checkpoint")
    steps = d.flat.get("trainer.max_steps", 0)
    if "trainer.max_steps" in d.flat:
        v = d.pop("trainer.max_steps")
        if v is None and task == "pretrain":
            d.problems.append("trainer.max_steps is null (Lightning 1.x: no step limit): pretraining is step-based "
                              "here; give trainer.max_steps=N")
        else:  # Lightning 1.x: null = no step limit, Lightning 2's -1: max_epochs bounds the run
            d.set("trainer.max_steps", -1 if v is None else v, "trainer.max_steps")
    if task != "pretrain" and "trainer.max_epochs" in d.flat:  # (pretraining lists it in NO_EFFECT)
        v = d.pop("trainer.max_epochs")
        if isinstance(steps, int) and steps > 0 and v in (None, -1):
            d.ignored["trainer.max_epochs"] = f"{v}: trainer.max_steps ({steps}) bounds the run"
        elif v is None:  # Lightning 1.x's default when neither limit is given
            d.set("trainer.max_epochs", 1000, "trainer.max_epochs")
        else:
            d.set("trainer.max_epochs", v, "trainer.max_epochs")
