"""Task-specific distillation's loss terms (``training/distill_task_loss.py``) against independent computations:
``torch.distributions``' KL of the softened categorical (or Bernoulli) distributions, position by position, on the
same logits; with and without T^2; the teacher's logits never get a gradient."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.distributions import Bernoulli, Categorical, kl_divergence

from bio_megatron.training.distill_task_loss import task_distill_loss, task_kl_loss


def _logits(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


def _kl(teacher_row: torch.Tensor, student_row: torch.Tensor, t: float) -> float:
    p, q = Categorical(logits=teacher_row.double() / t), Categorical(logits=student_row.double() / t)
    return float(kl_divergence(p, q))


@pytest.mark.parametrize("t2", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 3.5])
def test_token_kl_is_the_mean_over_labelled_tokens(temperature: float, t2: bool) -> None:
    s, t = _logits(3, 7, 5, seed=1), _logits(3, 7, 5, seed=2)
    labels = torch.full((3, 7), -100)
    labels[0, 1:4], labels[1, 2], labels[2, 0:6] = 1, 0, 4  # first sub-tokens only; padding and [CLS] are -100
    want = [_kl(t[b, i], s[b, i], temperature) for b in range(3) for i in range(7) if labels[b, i] != -100]
    got = task_kl_loss("tokens", s, t, {"labels": labels}, temperature, t2)
    assert float(got) == pytest.approx(sum(want) / len(want) * (temperature ** 2 if t2 else 1.0), rel=1e-5)


def test_sequence_kl_is_the_mean_over_examples() -> None:
    s, t = _logits(6, 4, seed=3), _logits(6, 4, seed=4)
    want = sum(_kl(t[b], s[b], 2.0) for b in range(6)) / 6 * 4.0
    assert float(task_kl_loss("sequence", s, t, {}, 2.0, True)) == pytest.approx(want, rel=1e-5)


def test_multilabel_kl_is_a_bernoulli_per_label() -> None:
    s, t = _logits(5, 10, seed=5), _logits(5, 10, seed=6)
    want = float(kl_divergence(Bernoulli(logits=t.double() / 2.0), Bernoulli(logits=s.double() / 2.0)).mean())
    assert float(task_kl_loss("multilabel", s, t, {}, 2.0, False)) == pytest.approx(want, rel=1e-5)


def test_span_kl_averages_start_and_end_over_the_real_tokens_only() -> None:
    s, t = _logits(2, 9, 2, seed=7), _logits(2, 9, 2, seed=8)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 6:], mask[1, 8:] = 0, 0
    want = []
    for b in range(2):
        n = int(mask[b].sum())
        want += [_kl(t[b, :n, k], s[b, :n, k], 2.0) for k in (0, 1)]
    got = task_kl_loss("span", s, t, {"attention_mask": mask}, 2.0, True)
    assert float(got) == pytest.approx(sum(want) / len(want) * 4.0, rel=1e-5)
    # what the padding holds changes nothing
    s2, t2 = s.clone(), t.clone()
    s2[0, 7], t2[1, 8] = 50.0, -50.0
    assert float(task_kl_loss("span", s2, t2, {"attention_mask": mask}, 2.0, True)) == pytest.approx(float(got))


def test_combined_loss_weights_the_terms_and_only_the_student_gets_gradients() -> None:
    s = _logits(4, 3, seed=9).requires_grad_(True)
    t = _logits(4, 3, seed=10).requires_grad_(True)
    labels = torch.tensor([0, 2, 1, 1])
    task = torch.nn.functional.cross_entropy(s, labels)
    d = SimpleNamespace(alpha_task=0.3, alpha_kl=0.7, temperature=2.0, kl_t2_scaling=True)
    loss, report = task_distill_loss("sequence", task, s, t, {}, d)
    kl = sum(_kl(t[b].detach(), s[b].detach(), 2.0) for b in range(4)) / 4 * 4.0
    assert float(report["kl_loss"]) == pytest.approx(kl, rel=1e-5)
    assert float(report["task_loss"]) == pytest.approx(float(task.detach()))
    assert float(loss.detach()) == pytest.approx(0.3 * float(task.detach()) + 0.7 * kl, rel=1e-5)
    loss.backward()
    assert t.grad is None and s.grad is not None and torch.isfinite(s.grad).all()
    # the gradient is the independent one's: d/ds of 0.3 CE + 0.7 T^2 KL(p_t || softmax(s / T))
    s_ref = s.detach().clone().requires_grad_(True)
    ref = 0.3 * torch.nn.functional.cross_entropy(s_ref, labels) + 0.7 * 4.0 * torch.stack(
        [kl_divergence(Categorical(logits=t[b].detach() / 2.0), Categorical(logits=s_ref[b] / 2.0))
         for b in range(4)]).mean()
    ref.backward()
    assert torch.allclose(s.grad, s_ref.grad, atol=1e-6)


def test_a_zero_kl_weight_computes_no_kl() -> None:
    s, t = _logits(2, 3, seed=11), torch.full((2, 3), math.nan)  # a NaN teacher would poison a computed KL
    d = SimpleNamespace(alpha_task=1.0, alpha_kl=0.0, temperature=2.0, kl_t2_scaling=True)
    loss, report = task_distill_loss("sequence", torch.tensor(0.5), s, t, {}, d)
    assert float(loss) == 0.5 and float(report["kl_loss"]) == 0.0
