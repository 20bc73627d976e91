"""Will the model's static state fit? Refuse a config before anything is allocated.

The static state of one rank is its parameters (the exact count of ``config/sizes.py::parameter_count``, split
by the TP/PP layout as megatron-core splits it) times the bytes megatron-core keeps per parameter:

- weights in the compute dtype (4 bytes fp32, 2 bf16/fp16);
- the gradient buffer of megatron DDP, fp32 (``grad_reduce_in_fp32``): 4;
- Adam's two moments, fp32: 8;
- fp32 main parameters under bf16/fp16: 4;
- with the distributed optimizer the moments and main parameters are sharded over the data-parallel ranks.

Activations, the CUDA context, allocator slack and the data pipeline are *not* counted (they depend on batch
and sequence length and are not static): the check refuses only what cannot fit even without them, so it
never stops a run that could have trained. The available memory is the GPU's free memory
(``torch.cuda.mem_get_info``), or on CPU ``MemAvailable`` (``/proc/meminfo``) bounded by the cgroup's limit,
shared by the ranks on this node. ``trainer.skip_memory_check=true`` skips the check.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import parameter_count
from bio_megatron.families import family_of_model
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
GIB = 2**30


@dataclass
class StateEstimate:
    parameters_per_rank: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    """Adam moments plus fp32 main parameters (bf16/fp16), after the distributed optimizer's sharding."""

    @property
    def total(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    def as_dict(self) -> dict:
        return {"parameters_per_rank": self.parameters_per_rank, "weights_gib": round(self.weight_bytes / GIB, 3),
                "grads_gib": round(self.grad_bytes / GIB, 3), "optimizer_gib": round(self.optimizer_bytes / GIB, 3),
                "static_state_gib_per_rank": round(self.total / GIB, 3),
                "note": "weights + fp32 gradients + Adam state (+ fp32 main params); activations excluded"}


def parameters_per_rank(m: ModelConfig, padded_vocab: int) -> int:
    """Parameters held by the most loaded rank: layers split over PP stages, matrices over TP (LayerNorms and
    biases of row-parallel layers replicated), the word embedding vocab-parallel on the first stage and, for
    tying, again on the last one when PP > 1 (megatron-core keeps a copy there)."""
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    s = m.shape()
    total = family_of_model(m).parameter_count(m, padded_vocab)
    if total != parameter_count(s, padded_vocab, m.max_position_embeddings, m.num_tokentypes, m.bert_binary_head):
        # not megatron-core's BertModel (ELECTRA's two encoders, ALBERT's shared layer): PP is 1 for those
        # families and nearly everything is a TP-split matrix
        return math.ceil(total / tp)
    h, f = s.hidden_size, s.ffn_hidden_size
    layer = (2 * h + (3 * h * h + 3 * h) // tp + h * h // tp + h + 2 * h + (h * f + f) // tp + f * h // tp + h)
    layers = math.ceil(s.num_layers / pp) * layer
    word = padded_vocab * h // tp
    first = word + (m.max_position_embeddings + m.num_tokentypes) * h + layers
    last = layers + 2 * h + (h * h + h + 2 * h + padded_vocab // tp) + (
        (h * h + h + 2 * h + 2) if m.bert_binary_head else 0) + (word if pp > 1 else 0)
    return first + (last - layers) if pp == 1 else max(first, last)


def estimate(m: ModelConfig, padded_vocab: int, mixed: bool, data_parallel: int) -> StateEstimate:
    """This rank's static state; ``mixed``: bf16/fp16 weights with fp32 main parameters (else fp32)."""
    n = parameters_per_rank(m, padded_vocab)
    shard = data_parallel if m.use_distributed_optimizer else 1
    optimizer = (8 + (4 if mixed else 0)) * n
    return StateEstimate(n, n * (2 if mixed else 4), 4 * n, math.ceil(optimizer / max(1, shard)))


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> tuple[int, str, int]:
    """``(bytes available, where, ranks sharing it)``: this GPU's free memory, or the node's available memory
    (bounded by the cgroup limit) shared by the ranks on this node."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free), f"GPU {torch.cuda.current_device()} free memory", 1
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        avail = min(avail, limit - used) if avail is not None else limit - used
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
                or 1)
    return (avail if avail is not None else -1), "available memory of this node (MemAvailable / cgroup)", ranks


def agreed_refusal(per_rank: int, available: tuple[int, str, int] | None = None) -> tuple[bool, int, str, int]:
    """(refuse, available bytes, where, ranks on this node): whether ``per_rank`` bytes on every rank of this node
    exceed what is available, agreed across all ranks (one rank refusing alone would hang the others)."""
    avail, where, ranks = available if available is not None else available_memory()
    refuse = avail >= 0 and per_rank * ranks > avail
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([float(refuse)], device="cuda" if torch.cuda.is_available() else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        refuse = bool(flag.item() > 0)
    return refuse, avail, where, ranks


def check_fits(m: ModelConfig, padded_vocab: int, dtype: torch.dtype, data_parallel: int,
               available: tuple[int, str, int] | None = None) -> StateEstimate:
    """Raise (exit 2, one line) when this rank's static state cannot fit; all ranks agree on the verdict."""
    est = estimate(m, padded_vocab, dtype != torch.float32, data_parallel)
    refuse, avail, where, ranks = agreed_refusal(est.total, available)
    if refuse:
        share = f" x {ranks} ranks on this node" if ranks > 1 else ""
        raise BioMegatronError(
            f"the model cannot fit: its static state alone is {est.total / GIB:.1f} GiB per rank{share} "
            f"({est.parameters_per_rank:,} parameters per rank: weights {est.weight_bytes / GIB:.1f} + fp32 "
            f"gradients {est.grad_bytes / GIB:.1f} + Adam state {est.optimizer_bytes / GIB:.1f} GiB; activations "
            f"excluded), {where} is {max(avail, 0) / GIB:.1f} GiB; raise model.tensor_model_parallel_size or "
            f"model.pipeline_model_parallel_size, set model.use_distributed_optimizer=true with more data-parallel "
            f"ranks, or choose a smaller model.size (trainer.skip_memory_check=true skips this check)")
    log.debug("static state %.2f GiB per rank; %s %.1f GiB", est.total / GIB, where, avail / GIB)
    return est
