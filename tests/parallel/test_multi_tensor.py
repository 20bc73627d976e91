"""The shim's stand-ins for megatron-core's pure-PyTorch multi_tensor_scale / multi_tensor_l2norm fallbacks
give megatron's own results bit for bit (compared as raw bits, so -0.0, inf and NaN count), and install() puts
them where megatron's gradient clipping and mixed-precision optimizer look them up."""

from __future__ import annotations

from harness import run_world

SHAPES = [(257, 33), (4096,), (3, 5, 7), (1,), (0,)]


def _bits(t):
    import torch

    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype])


def _compare() -> dict:
    import torch
    from megatron.core import utils as mutils
    from megatron.core.optimizer import clip_grads, optimizer

    from bio_megatron.parallel import multi_tensor, seam

    seam.install()
    g = torch.Generator().manual_seed(0)

    def tensors(scale: float = 1e-3) -> list:
        ts = [torch.randn(s, generator=g) * scale for s in SHAPES]
        ts[0][0, :4] = torch.tensor([-0.0, float("inf"), float("nan"), 1e-42])  # incl. a subnormal
        return ts

    same = {}
    for scale in (0.37, 1.0, 3e-39):
        a = tensors()
        b = [t.clone() for t in a]
        mutils.local_multi_tensor_scale(0, None, [a, a], scale)  # gradient clipping: in place
        multi_tensor.multi_tensor_scale(0, None, [b, b], scale)
        same[f"in place x{scale}"] = all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))
        for dtype in (torch.bfloat16, torch.float16, torch.float32):  # main params -> model params (scale 1.0)
            src = tensors(scale=3.0)
            d1, d2 = ([torch.empty(s, dtype=dtype) for s in SHAPES] for _ in range(2))
            mutils.local_multi_tensor_scale(0, None, [src, d1], scale)
            multi_tensor.multi_tensor_scale(0, None, [src, d2], scale)
            same[f"to {dtype} x{scale}"] = all(torch.equal(_bits(x), _bits(y)) for x, y in zip(d1, d2))
    for magnitude in (1e-20, 1e-3, 1e3):
        lists = [tensors(magnitude)[1:], tensors(magnitude)[1:]]  # finite values
        ref, _ = mutils.local_multi_tensor_l2_norm(0, None, lists, False)
        got, _ = multi_tensor.multi_tensor_l2_norm(0, None, lists, False)
        same[f"l2 {magnitude}"] = (got.dtype == ref.dtype and got.shape == ref.shape
                                   and torch.equal(_bits(got), _bits(ref)) and ref.item() > 0)
    installed = (clip_grads.multi_tensor_scale_impl is multi_tensor.multi_tensor_scale
                 and optimizer.multi_tensor_scale_impl is multi_tensor.multi_tensor_scale
                 and clip_grads.l2_norm_impl is multi_tensor.multi_tensor_l2_norm)
    return {"same": same, "installed": installed}


def test_stand_ins_are_bit_identical_and_installed():
    (res,) = run_world(1, _compare, timeout=120)
    assert res["installed"]
    assert res["same"] and all(res["same"].values()), res["same"]
