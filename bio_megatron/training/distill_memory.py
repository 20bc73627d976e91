"""Will distillation fit? The student's static state (``training/memory.py``: weights, fp32 gradients, Adam state,
fp32 main parameters) plus the teacher's share of each rank, refused in one line before either model is allocated.

The teacher has no gradients and no optimizer state, so its static state is its weights alone (its compute dtype,
split by the shared TP layout). Unlike the student's, its activations are counted too, because they are certain
and do not shrink with recomputation: a forward-only pass keeps, per micro-batch, its logits over this rank's
vocabulary slice (in its dtype) and their two float32 temperature-softened log-probabilities the KL builds, its last
hidden states, and at its peak one layer's largest transient (the attention scores of this rank's heads in float32,
or the FFN's intermediate). The student's activations stay excluded, as in pretraining's check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.training import memory
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
GIB = memory.GIB


@dataclass
class TeacherEstimate:
    parameters_per_rank: int
    weight_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes


def teacher_estimate(t: ModelConfig, padded_vocab: int, dtype: torch.dtype, micro_batch: int,
                     seq_length: int) -> TeacherEstimate:
    """This rank's share of the teacher ``t`` (its config at the run's TP layout, PP 1) running forward only."""
    n = memory.parameters_per_rank(t, padded_vocab)
    size = torch.finfo(dtype).bits // 8
    tp, s = t.tensor_model_parallel_size, t.shape()
    tokens = micro_batch * seq_length
    logits = tokens * (padded_vocab // tp) * (size + 2 * 4)  # the slice, then two float32 log-softmaxes
    hidden = tokens * s.hidden_size * size
    layer = max(micro_batch * (s.num_attention_heads // tp) * seq_length * seq_length * 4,
                tokens * (s.ffn_hidden_size // tp) * size)
    return TeacherEstimate(n, n * size, logits + hidden + layer)


def check_distill_fits(student: ModelConfig, student_padded: int, dtype: torch.dtype, teacher: ModelConfig,
                       teacher_padded: int, teacher_dtype: torch.dtype, data_parallel: int,
                       available: tuple[int, str, int] | None = None) -> tuple[memory.StateEstimate, TeacherEstimate]:
    """Raise (exit 2, one line) when the student's static state and the teacher's weights and activations cannot
    fit together on a rank; all ranks agree on the verdict."""
    est = memory.estimate(student, student_padded, dtype != torch.float32, data_parallel)
    tea = teacher_estimate(teacher, teacher_padded, teacher_dtype, student.micro_batch_size,
                           student.encoder_seq_length)
    refuse, avail, where, ranks = memory.agreed_refusal(est.total + tea.total, available)
    if refuse:
        share = f" x {ranks} ranks on this node" if ranks > 1 else ""
        raise BioMegatronError(
            f"student and teacher cannot fit together: {(est.total + tea.total) / GIB:.1f} GiB per rank{share} "
            f"(student's static state {est.total / GIB:.1f} GiB: {est.parameters_per_rank:,} parameters with fp32 "
            f"gradients and Adam state; teacher {tea.total / GIB:.1f} GiB: {tea.parameters_per_rank:,} parameters "
            f"{tea.weight_bytes / GIB:.1f} GiB + forward activations {tea.activation_bytes / GIB:.1f} GiB at "
            f"model.micro_batch_size {student.micro_batch_size} x {student.encoder_seq_length} tokens), {where} is "
            f"{max(avail, 0) / GIB:.1f} GiB; raise model.tensor_model_parallel_size, lower model.micro_batch_size, "
            "run the teacher in bf16 (model.teacher.precision=bf16), set model.use_distributed_optimizer=true with "
            "more data-parallel ranks, or choose a smaller teacher or student (trainer.skip_memory_check=true "
            "skips this check)")
    log.debug("distillation memory per rank: student %.2f GiB + teacher %.2f GiB; %s %.1f GiB", est.total / GIB,
              tea.total / GIB, where, avail / GIB)
    return est, tea
