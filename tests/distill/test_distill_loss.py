"""Each distillation loss term equals an independent plain-torch computation on the same logits and hidden states
(torch's kl_div / cross_entropy / cosine_embedding_loss on the real vocabulary), at TP1 and at TP2 where each rank
holds half of the (padded) vocabulary; the gradients of the student's logits and of the projection agree too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from harness import run_world

B, S, V, PADDED, HS, HT = 3, 5, 37, 64, 8, 12  # the padding (37 -> 64) leaves rank 1 of TP2 mostly padding


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    student = torch.randn(B, S, PADDED, generator=g) * 3
    teacher = torch.randn(B, S, PADDED, generator=g) * 3
    student[..., V:] = float("-inf")  # what mask_padded_vocab leaves in the padded columns
    teacher[..., V:] = float("-inf")
    padding = torch.ones(B, S)
    padding[0, 3:] = 0
    padding[2, 4:] = 0
    loss_mask = (torch.rand(B, S, generator=g) < 0.5).float() * padding
    loss_mask[1, 1] = 1
    return {"student": student, "teacher": teacher, "labels": torch.randint(0, V, (B, S), generator=g),
            "padding": padding, "loss_mask": loss_mask, "hs": torch.randn(B, S, HS, generator=g),
            "ht": torch.randn(B, S, HT, generator=g), "proj_w": torch.randn(HT, HS, generator=g) * 0.3,
            "proj_b": torch.randn(HT, generator=g) * 0.1}


def _reference(x: dict, temperature: float, t2: bool, masked: bool) -> dict[str, torch.Tensor]:
    """The three terms in plain torch, on the real vocabulary, with gradients of the student's logits."""
    student = x["student"][..., :V].clone().requires_grad_()
    positions = (x["loss_mask"] if masked else x["padding"]).bool()
    s, t = student[positions] / temperature, x["teacher"][..., :V][positions] / temperature
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="batchmean", log_target=True)
    kl = kl * (temperature ** 2 if t2 else 1.0)
    m = x["loss_mask"].bool()
    ce = F.cross_entropy(student[m], x["labels"][m])
    (kl + ce).backward()
    proj = torch.nn.Linear(HS, HT)
    with torch.no_grad():
        proj.weight.copy_(x["proj_w"]), proj.bias.copy_(x["proj_b"])
    real = x["padding"].bool()
    cos = F.cosine_embedding_loss(proj(x["hs"][real]), x["ht"][real], torch.ones(int(real.sum())))
    cos.backward()
    return {"kl": kl.detach(), "mlm": ce.detach(), "cos": cos.detach(), "grad": student.grad,
            "proj_grad": proj.weight.grad}


def _ours(x: dict, temperature: float, t2: bool, masked: bool) -> dict[str, torch.Tensor]:
    """The terms from bio_megatron.training.distill_loss on this rank's vocabulary slice."""
    from megatron.core import parallel_state as ps

    from bio_megatron.training import distill_loss as dl

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    per = PADDED // tp
    student = x["student"][..., rank * per:(rank + 1) * per].clone().requires_grad_()
    teacher = x["teacher"][..., rank * per:(rank + 1) * per]
    positions = (x["loss_mask"] if masked else x["padding"]).bool()
    kl = dl.kl_loss(student, teacher, positions, V, temperature, t2)
    ce = dl.mlm_loss(student, x["labels"], x["loss_mask"], V)
    (kl + ce).backward()
    proj = torch.nn.Linear(HS, HT)
    with torch.no_grad():
        proj.weight.copy_(x["proj_w"]), proj.bias.copy_(x["proj_b"])
    cos = dl.cosine_loss(x["hs"], x["ht"], x["padding"].bool(), proj)
    cos.backward()
    grad = torch.zeros(B, S, PADDED)
    grad[..., rank * per:(rank + 1) * per] = student.grad
    if tp > 1:
        torch.distributed.all_reduce(grad)  # the slices side by side: the gathered gradient, for comparison only
    return {"kl": kl.detach(), "mlm": ce.detach(), "cos": cos.detach(), "grad": grad[..., :V],
            "proj_grad": proj.weight.grad, "padded_grad": grad[..., V:]}


def _check(tp: int, cases: list[tuple[float, bool, bool]]) -> list[str]:
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(tp, 1, 1234)
    x, problems = _inputs(), []
    for temperature, t2, masked in cases:
        ref, ours = _reference(x, temperature, t2, masked), _ours(x, temperature, t2, masked)
        for key in ("kl", "mlm", "cos", "grad", "proj_grad"):
            if not torch.allclose(ours[key], ref[key], rtol=1e-5, atol=1e-6):
                err = (ours[key] - ref[key]).abs().max().item()
                problems.append(f"T={temperature} t2={t2} masked={masked} {key}: max error {err:.3g}")
        if ours["padded_grad"].abs().sum() != 0:
            problems.append("the padded vocabulary columns got a gradient")
    return problems


CASES = [(2.0, True, False), (2.0, False, False), (1.0, True, True), (3.5, False, True)]


def test_terms_equal_plain_torch_at_tp1() -> None:
    assert run_world(1, _check, 1, CASES) == [[]]


def test_terms_equal_the_gathered_computation_at_tp2() -> None:
    assert run_world(2, _check, 2, CASES) == [[], []]


def test_combined_loss_weights_the_terms_and_reports_each() -> None:
    assert run_world(1, _combined) == [None]


def _combined() -> None:
    from types import SimpleNamespace

    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.distill_loss import distill_loss

    init_distributed()
    init_model_parallel(1, 1, 1234)
    x = _inputs()
    ref = _reference(x, 2.0, True, False)
    d = SimpleNamespace(alpha_mlm=5.0, alpha_kl=2.0, alpha_cos=1.0, temperature=2.0, kl_t2_scaling=True,
                        kl_positions="all")
    proj = torch.nn.Linear(HS, HT)
    with torch.no_grad():
        proj.weight.copy_(x["proj_w"]), proj.bias.copy_(x["proj_b"])
    loss, report = distill_loss(x["student"], x["teacher"], x["hs"], x["ht"], x["labels"], x["loss_mask"],
                                x["padding"], V, d, proj)
    for key, ref_key in (("mlm_loss", "mlm"), ("kl_loss", "kl"), ("cos_loss", "cos")):
        torch.testing.assert_close(report[key], ref[ref_key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, 5.0 * ref["mlm"] + 2.0 * ref["kl"] + 1.0 * ref["cos"], rtol=1e-5, atol=1e-6)
    d.alpha_kl = 0.0  # a term with weight 0 is left out
    loss, report = distill_loss(x["student"], x["teacher"], x["hs"], x["ht"], x["labels"], x["loss_mask"],
                                x["padding"], V, d, proj)
    assert report["kl_loss"] == 0
    torch.testing.assert_close(loss, 5.0 * ref["mlm"] + ref["cos"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", ["nan"])
def test_a_nan_teacher_gives_a_nan_loss_for_the_guard(bad: str) -> None:
    """A non-finite teacher must not be hidden: the NaN guard of the loop sees the loss."""
    assert run_world(1, _nan_teacher) == [True]


def _nan_teacher() -> bool:
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.distill_loss import kl_loss

    init_distributed()
    init_model_parallel(1, 1, 1234)
    x = _inputs()
    x["teacher"][0, 0, 0] = float("nan")
    return bool(torch.isnan(kl_loss(x["student"], x["teacher"], x["padding"].bool(), V, 2.0, True)))
