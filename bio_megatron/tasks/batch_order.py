"""The order fine-tuning takes its training examples in, one epoch at a time.

Every epoch is a fresh shuffle, the same on every rank and on resume (a function of the seed and the epoch only).
An epoch is ``n // global_batch`` whole global batches; the shuffle's last ``n % global_batch`` examples sit the
epoch out.

``model.dataset.group_by_length: true`` (the name of transformers' ``TrainingArguments`` option, whose
``LengthGroupedSampler`` it follows) groups examples of similar length into the same global batch, so a step pads
to a length near its own examples' instead of to the longest of a random draw: on BC5CDR's sentences it removes
most padded positions (docs/BENCHMARKS.md). The epoch's examples stay those of the plain shuffle: the same
examples sit out. They are cut into mega-batches of :data:`MEGA_BATCHES` global batches, each sorted by length
and cut into global batches, and the epoch's global batches are then shuffled, so successive steps do not climb
from short to long. What changes is which examples share a step: gradients are averaged over examples of similar
length, as with transformers' option.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MEGA_BATCHES = 50  # global batches sorted together (transformers' LengthGroupedSampler: at most 50 batches)


def _generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000 + epoch)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order of the ``n`` training examples in ``epoch`` (0-based): a fresh shuffle per epoch."""
    return torch.randperm(n, generator=_generator(seed, epoch)).tolist()


def length_grouped_order(n: int, length: Callable[[int], int], batch: int, seed: int, epoch: int) -> list[int]:
    """:func:`epoch_order`'s examples regrouped so that each global batch of ``batch`` holds examples of similar
    ``length(i)`` (module docstring). The examples that sit the epoch out are the plain shuffle's, kept last."""
    g = _generator(seed, epoch)
    order = torch.randperm(n, generator=g).tolist()  # == epoch_order(n, seed, epoch)
    used = (n // batch) * batch
    if used <= batch:  # one batch or none: nothing to regroup
        return order
    span = MEGA_BATCHES * batch
    batches = []
    for start in range(0, used, span):
        # Stable on the shuffle's position, so equal lengths keep a random order and ties are deterministic.
        mega = sorted(order[start:min(start + span, used)], key=length)
        batches += [mega[k:k + batch] for k in range(0, len(mega), batch)]
    shuffled = torch.randperm(len(batches), generator=g).tolist()
    return [i for b in shuffled for i in batches[b]] + order[used:]


def train_order(n: int, length: Callable[[int], int], batch: int, seed: int, epoch: int,
                group_by_length: bool) -> list[int]:
    """The order a fine-tuning run takes its ``n`` training examples in, in ``epoch``: grouped by length
    (``model.dataset.group_by_length``) or the plain shuffle."""
    return length_grouped_order(n, length, batch, seed, epoch) if group_by_length else epoch_order(n, seed, epoch)
