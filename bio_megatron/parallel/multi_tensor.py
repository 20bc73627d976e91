"""Bit-identical, cheaper stand-ins for megatron-core's pure-PyTorch multi-tensor fallbacks.

Without apex and Transformer Engine (a plain pip install, and every CPU run), megatron-core 0.19.2 falls back to
``megatron.core.utils.local_multi_tensor_scale`` and ``local_multi_tensor_l2_norm``:

* ``local_multi_tensor_scale`` does ``dst.copy_(src * scale)`` tensor by tensor: a temporary as large as the
  tensor, then a copy. Gradient clipping calls it with ``src is dst`` (clip_grads.py:230) whenever the norm
  exceeds the limit: at 345m, 1.3 GB of temporaries and two extra passes over memory per step. The fp16
  optimizer calls it with ``scale=1.0`` to copy its fp32 main parameters into the model's after every step
  (optimizer.py:92; bf16 copies with a plain loop).
* ``local_multi_tensor_l2_norm`` turns every per-tensor norm into a Python float (one ``.item()`` each) before
  the final norm.

The replacements compute the same values bit for bit: ``x * s`` rounds the same whether it is written to a
temporary or in place (``_foreach_mul_``); ``x * 1.0 == x`` exactly (also -0.0, inf and NaN), so a copy is a scale
by 1.0 (``_foreach_copy_``, which rounds to the destination dtype as ``copy_`` does); and the l2 norm takes the
same per-tensor norms (``_foreach_norm`` runs ``linalg_vector_norm`` per tensor, as ``torch.norm`` does) and
reduces the same float32 vector. ``tests/parallel/test_multi_tensor.py`` checks each against megatron's own.
"""

from __future__ import annotations

import torch

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list, scale: float) -> None:
    """``dst = src * scale`` for each pair, as ``local_multi_tensor_scale`` (which also ignores ``noop_flag``)."""
    src, dst = tensor_lists
    if scale == 1.0:
        torch._foreach_copy_(dst, src)
    elif len(src) == len(dst) and all(s is d for s, d in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    else:  # distinct tensors and a real scale: megatron's own loop (a temporary per tensor)
        for s, d in zip(src, dst):
            d.copy_(s * scale)


def multi_tensor_l2_norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list, per_tensor: bool,
                         *args) -> tuple[torch.Tensor, None]:
    """The l2 norm over every tensor of every list, as a 1-element float32 tensor (``local_multi_tensor_l2_norm``)."""
    tensors = [t for tl in tensor_lists for t in tl]
    if any(t.dtype != torch.float32 for t in tensors):  # megatron only norms fp32 main grads; keep its path else
        from megatron.core.utils import local_multi_tensor_l2_norm

        return local_multi_tensor_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args)
    norms = torch._foreach_norm(tensors) if tensors else []
    # megatron builds torch.tensor([[norm, ...]]) from Python floats: the same float32 values in the same order
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    return total.reshape(1), None


def install() -> bool:
    """Point megatron-core's optimizer modules at the stand-ins where they use the local fallbacks; returns
    whether anything was replaced (False with apex or Transformer Engine, whose fused kernels stay)."""
    from megatron.core import utils as mutils
    from megatron.core.optimizer import clip_grads, optimizer

    replaced = []
    for mod in (clip_grads, optimizer):
        if getattr(mod, "multi_tensor_scale_impl", None) is mutils.local_multi_tensor_scale:
            mod.multi_tensor_scale_impl = multi_tensor_scale
            replaced.append(f"{mod.__name__}.multi_tensor_scale_impl")
    if getattr(clip_grads, "l2_norm_impl", None) is mutils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = multi_tensor_l2_norm
        replaced.append(f"{clip_grads.__name__}.l2_norm_impl")
    if replaced:
        log.debug("multi-tensor fallbacks replaced: %s", ", ".join(replaced))
    return bool(replaced)
