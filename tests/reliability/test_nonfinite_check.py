"""The gradient guard's NaN/Inf check (``training.guards._nonfinite``) takes a one-pass sum first and checks element
by element only when the sum is not finite: it must still flag exactly the tensors holding a NaN or an Inf, also
where finite values sum past the fp32 range (not flagged) and where +Inf and -Inf meet (flagged)."""

from __future__ import annotations

import pytest
import torch

from bio_megatron.training.guards import _nonfinite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nonfinite_flags_exactly_nan_and_inf(dtype):
    big = 6e4 if dtype == torch.float16 else 3e38
    clean = torch.linspace(-1, 1, 1000).to(dtype)
    assert not _nonfinite([clean, None, torch.empty(0, dtype=dtype)])
    assert not _nonfinite([torch.full((64,), big, dtype=dtype)])  # finite, though the sum overflows fp32/fp16
    assert not _nonfinite([])
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = clean.clone()
        t[517] = bad
        assert _nonfinite([clean, t]), bad
    both = clean.clone()
    both[3], both[9] = float("inf"), float("-inf")  # their sum is NaN: still flagged
    assert _nonfinite([both])
