"""The training order with ``model.dataset.group_by_length`` (tasks/batch_order.py) against its definition: the plain
shuffle's examples, the same ones sitting the epoch out, each global batch drawn from one sorted mega-batch, and a
function of the seed and epoch only (so every rank and a resumed run take the same batches). The lengths are
BC5CDR's real token counts (tests/test_batches.py runs it through the fine-tuning loop's batches)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bio_megatron.tasks.batch_order import MEGA_BATCHES, epoch_order, length_grouped_order

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "finetune" / "bc5cdr_chem_train_head.tsv"


def _sentence_lengths() -> list[int]:
    """Words per sentence of the BC5CDR slice, repeated to a few mega-batches' worth."""
    lengths, n = [], 0
    for line in FIXTURE.read_text(encoding="utf-8").splitlines():
        if line.strip():
            n += 1
        elif n:
            lengths.append(n)
            n = 0
    return (lengths * 40)[:2 * MEGA_BATCHES * 8 + 37]  # two full mega-batches and a part, plus a remainder


@pytest.mark.parametrize("batch", [8, 3])
def test_grouped_epoch_is_the_plain_shuffle_regrouped(batch):
    lengths = _sentence_lengths()
    n, seed = len(lengths), 1234
    for epoch in (0, 1):
        plain, grouped = epoch_order(n, seed, epoch), length_grouped_order(n, lengths.__getitem__, batch, seed, epoch)
        used = n // batch * batch
        assert grouped[used:] == plain[used:]  # the same examples sit the epoch out
        assert sorted(grouped[:used]) == sorted(plain[:used])
        assert grouped == length_grouped_order(n, lengths.__getitem__, batch, seed, epoch)  # same on every rank
        span = MEGA_BATCHES * batch
        megas = [set(plain[s:min(s + span, used)]) for s in range(0, used, span)]
        pad = {"plain": 0, "grouped": 0}
        for k in range(0, used, batch):
            b = grouped[k:k + batch]
            assert any(set(b) <= m for m in megas)  # one mega-batch's examples, as sorted there
            pad["grouped"] += batch * max(lengths[i] for i in b) - sum(lengths[i] for i in b)
            pad["plain"] += batch * max(lengths[i] for i in plain[k:k + batch]) - sum(lengths[i] for i in plain[k:k + batch])
        assert pad["grouped"] < 0.25 * pad["plain"], pad
    assert length_grouped_order(n, lengths.__getitem__, batch, seed, 0) != \
        length_grouped_order(n, lengths.__getitem__, batch, seed, 1)


def test_a_single_batch_epoch_is_left_as_drawn():
    assert length_grouped_order(5, lambda i: 10 - i, 8, 3, 0) == epoch_order(5, 3, 0)
    assert length_grouped_order(8, lambda i: 10 - i, 8, 3, 0) == epoch_order(8, 3, 0)
