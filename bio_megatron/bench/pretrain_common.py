"""What both sides of ``bench pretrain`` share: the seed, the synthetic MLM batch, the device a side runs on, and
the name of the Adam implementation a side's optimizer runs (reported beside its timings).

Its own module so that the Hugging Face side (``bench/hf_pretrain.py``, run in a process of its own by
``bench/hf_process.py``) takes them without importing our side, and ours without importing the HF one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SEED = 1234


def bench_device() -> "torch.device":
    """This rank's GPU, else the CPU. Not ``parallel.distributed.rank_device``: the HF side's process stays free
    of megatron-core."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def synthetic_batch(vocab: int, micro_batch: int, seq: int, binary_head: bool) -> dict[str, "torch.Tensor"]:
    """A full-length MLM batch in the layout of megatron-core's BERT dataset (15% of positions masked)."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    text = torch.randint(5, vocab, (micro_batch, seq), generator=g)
    loss_mask = (torch.rand(micro_batch, seq, generator=g) < 0.15).long()
    loss_mask[:, 1] = 1  # never an empty loss
    types_ = (torch.arange(seq) >= seq // 2).long().expand(micro_batch, seq).contiguous()
    return {"text": text, "types": types_, "labels": torch.randint(5, vocab, (micro_batch, seq), generator=g),
            "loss_mask": loss_mask, "padding_mask": torch.ones(micro_batch, seq, dtype=torch.long),
            "is_random": torch.zeros(micro_batch, dtype=torch.long) if binary_head else None}


def optimizer_impl(opt: Any) -> str:
    """Which Adam implementation runs, e.g. ``AdamW (single-tensor)``, for megatron's wrappers or a torch optimizer."""
    import torch

    opt = getattr(opt, "chained_optimizers", [opt])[0]
    inner = getattr(opt, "optimizer", opt)  # megatron's FP32Optimizer / Float16Optimizer wrap the torch one
    if not isinstance(inner, torch.optim.Optimizer) or type(inner).__module__.split(".")[0] != "torch":
        return f"{type(inner).__module__}.{type(inner).__name__}"  # e.g. Transformer Engine's FusedAdam
    group = inner.param_groups[0]
    on_gpu = group["params"][0].is_cuda
    impl = ("fused" if group.get("fused") else
            "foreach" if group.get("foreach") or (group.get("foreach") is None and on_gpu) else "single-tensor")
    return f"{type(inner).__name__} ({impl})"
