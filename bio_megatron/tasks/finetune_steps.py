"""The fine-tuning step's data and its evaluation pass: the forward step (encoder + the task's head and loss), the
deterministic global batches (the same on every rank, each data-parallel rank taking its share in micro-batches,
packed or length-grouped where the config asks), and the per-example outputs of a split gathered from the last
pipeline stage. ``tasks/finetune.py`` runs them; ``bench finetune`` times them."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from bio_megatron.config.finetune import FinetuneConfig
from bio_megatron.tasks.batch_order import train_order
from bio_megatron.tasks.packing import model_inputs, pack
from bio_megatron.tasks.protocol import Split, Task
from bio_megatron.training.loop import LoopState, reduce_losses, run_batches
from bio_megatron.training.pretrain import to_device

# Micro-batches pad to their longest example rounded up to this (tensor-core tiles on a GPU; none on the CPU).
PAD_MULTIPLE = 8 if torch.cuda.is_available() else 1


def forward_step(data_iterator, model, task: Task, keep_outputs: bool):
    """One micro-batch through encoder + head; on the last stage the task loss (and, for evaluation, the
    per-example predictions) are reported."""
    b = to_device(next(data_iterator))
    args, kwargs = model_inputs(b)  # packed batches (model.dataset.packing) add the packed rows and their layout
    out = model(*args, **kwargs)
    if not ps.is_pipeline_last_stage():
        return out, None
    loss = task.loss(out, b)
    report = {"loss": loss.detach().clone(), **getattr(task, "last_report", {})}  # distillation's terms
    if keep_outputs:
        report["outputs"] = list(zip(b["index"].tolist(), task.outputs(out.detach().float(), b)))
    return loss, lambda output: (output, report)


def steps_per_epoch(train_examples: int, global_batch_size: int) -> int:
    """Optimizer steps per epoch: whole global batches (the remainder of an epoch is not a step; at least 1)."""
    return max(1, train_examples // global_batch_size)


class Batches:
    """Deterministic global batches (same on every rank) cut to this data-parallel rank's micro-batches."""

    def __init__(self, task: Task, cfg: FinetuneConfig):
        m = cfg.model
        self.task, self.seed = task, cfg.trainer.seed
        self.mbs, self.gbs = m.micro_batch_size, m.global_batch_size
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        self.max_len = m.dataset.max_seq_length
        self.packing = getattr(m.dataset, "packing", False)  # NER and classification (tasks/packing.py)
        self.group_by_length = m.dataset.group_by_length  # tasks/batch_order.py
        self.steps_per_epoch = steps_per_epoch(len(task.train.features), self.gbs)
        self.state: LoopState | None = None  # run_batches reads seq_length from it
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its order): drawn once per epoch

    def _micro(self, split: Split, indices: list[int]) -> list[dict]:
        # The global batch's longest example, so the same on every rank (one p2p shape per step). On a GPU rounded
        # up to a multiple of 8 for the tensor cores; on the CPU no rounding, which would only add padded positions
        # (5% of an unpacked BC5CDR epoch's, docs/BENCHMARKS.md).
        seq = max(self.task.length(split, max(i, 0)) for i in indices)
        seq = min(self.max_len, int(math.ceil(seq / PAD_MULTIPLE) * PAD_MULTIPLE))
        self.state.seq_length = seq
        per = len(indices) // self.dp
        mine = indices[self.dp_rank * per:(self.dp_rank + 1) * per]
        micro = [self.task.collate(split, mine[k:k + self.mbs], seq) for k in range(0, len(mine), self.mbs)]
        # Packed rows are max_seq_length long: a row then holds as many examples as fit, not one padded one.
        return [pack(b, self.max_len, self.task.tokenizer.pad) for b in micro] if self.packing else micro

    def epoch(self, epoch: int) -> list[int]:
        """The training examples' order in ``epoch`` (tasks/batch_order.py), the same on every rank."""
        if self._order[0] != epoch:
            split = self.task.train
            self._order = (epoch, train_order(len(split.features), lambda i: self.task.length(split, i), self.gbs,
                                              self.seed, epoch, self.group_by_length))
        return self._order[1]

    def train(self, step: int) -> list[dict]:
        epoch, within = divmod(step, self.steps_per_epoch)
        perm = self.epoch(epoch)
        idx = [perm[(within * self.gbs + k) % len(perm)] for k in range(self.gbs)]
        return self._micro(self.task.train, idx)

    def eval_groups(self, split: Split, n: int):
        """All examples in groups of ``micro x DP`` (padded with index -1 rows that are dropped later), shortest
        first: each group then pads to a length near its own examples' (40% fewer positions on BC5CDR's dev
        sentences). Outputs are keyed by example index, so the predictions and scores are those of any order."""
        size = self.mbs * self.dp
        order = sorted(range(n), key=lambda i: (self.task.length(split, i), i))
        for start in range(0, n, size):
            idx = order[start:start + size]
            yield self._micro(split, idx + [-1] * (size - len(idx)))


@torch.no_grad()
def predict_split(state: LoopState, batches: Batches, split: Split, n: int, losses: list | None = None) -> list:
    """Per-example outputs of ``split`` in order, gathered from the last stage's TP-rank-0 processes.
    ``losses`` (collective): gets the mean task loss over the split's micro-batches appended (NeMo's val_loss;
    the padding rows of the last group repeat example 0)."""
    state.model.eval()
    mine, records = [], []
    for mbs in batches.eval_groups(split, n):
        for rec in run_batches(state, mbs, forward_only=True):
            mine.extend(rec["outputs"])
            records.append(rec)
    state.model.train()
    if losses is not None:
        losses.append(reduce_losses(records))
    keep = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine if keep else [])
    merged = {i: o for part in gathered for i, o in part if i >= 0}
    return [merged[i] for i in range(n)]
