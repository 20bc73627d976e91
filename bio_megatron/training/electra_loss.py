"""ELECTRA's loss (replaced-token detection, Clark et al. 2020) on one micro-batch, its Gumbel-noise seeds and
the figures it adds to the step record.

loss = generator MLM loss (mean over masked positions) + ``discriminator_loss_weight`` x discriminator
binary cross entropy (mean over all real, non-padding tokens, [CLS] and [SEP] included, as ELECTRA).
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

# Per-micro-batch values the loop averages over micro-batches and data-parallel ranks like the loss. Counts
# are averaged too, so the ratios of their averages are the ratios of their global sums.
REPORT_KEYS = ("generator_loss", "discriminator_loss", "real_tokens", "replaced_tokens", "correct_tokens",
               "correct_replaced")


def noise_seeds(sample_index: torch.Tensor, seed: int, split: str) -> list[int]:
    """One 63-bit seed per sequence for the generator's Gumbel noise, from (trainer.seed, split, position of
    the sample in its split): the same at every TP/DP layout and micro-batch size, and on resume."""
    return [int.from_bytes(hashlib.blake2b(f"electra:{seed}:{split}:{i}".encode(), digest_size=8).digest(),
                           "little") >> 1 for i in sample_index.tolist()]


def electra_loss(generator_loss: torch.Tensor, discriminator_logits: torch.Tensor, replaced: torch.Tensor,
                 padding_mask: torch.Tensor, weight: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss and its report (``loss`` plus :data:`REPORT_KEYS`), from ``ElectraModel``'s
    outputs: per-masked-token generator loss [n], discriminator logits [b, s], replaced tokens [b, s]."""
    real = padding_mask.bool()
    n_real = real.sum().clamp(min=1).float()
    gen = generator_loss.float().sum() / max(generator_loss.numel(), 1)
    bce = F.binary_cross_entropy_with_logits(discriminator_logits.float(), replaced.float(), reduction="none")
    disc = (bce * real).sum() / n_real
    loss = gen + weight * disc
    with torch.no_grad():
        correct = ((discriminator_logits > 0) == replaced) & real
        report = {"loss": loss.detach().clone(), "generator_loss": gen.detach().clone(),
                  "discriminator_loss": disc.detach().clone(), "real_tokens": real.sum().float(),
                  "replaced_tokens": replaced.sum().float(), "correct_tokens": correct.sum().float(),
                  "correct_replaced": (correct & replaced).sum().float()}
    return loss, report


def step_metrics(reduced: dict[str, float]) -> dict[str, float]:
    """The step record's ELECTRA figures from the reduced report: both losses, the discriminator's accuracy
    over all real tokens and over the replaced ones (its recall), and the fraction replaced (1 minus it is the
    accuracy of always answering "original")."""
    if not reduced:
        return {}
    real, replaced = max(reduced["real_tokens"], 1e-12), reduced["replaced_tokens"]
    return {"generator_loss": reduced["generator_loss"], "discriminator_loss": reduced["discriminator_loss"],
            "discriminator_accuracy": reduced["correct_tokens"] / real,
            "discriminator_replaced_accuracy": reduced["correct_replaced"] / replaced if replaced else None,
            "replaced_fraction": replaced / real}
