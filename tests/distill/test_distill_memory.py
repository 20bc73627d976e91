"""The pre-allocation memory check of ``distill`` counts the teacher (weights in its dtype, forward activations)
beside the student's static state: a memory that holds the student alone but not both is refused in one line
naming both parts; the same memory plus what the teacher needs is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bio_megatron.utils.errors import BioMegatronError

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "distill" / "tiny_distill.yaml"


def _models(*over: str):
    from bio_megatron.config.distill import load_distill_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.loading.teacher import teacher_config

    cfg = load_distill_config(RECIPE, ["model.teacher.restore_from_path=teacher", *over])
    teacher = teacher_config(cfg.model, {"size": "base", "family": "megatron_bert"})  # BERT-base, 108 M
    return cfg.model, teacher, padded_vocab_size(28996, 128, cfg.model.tensor_model_parallel_size)


@pytest.mark.parametrize("over", [(), ("model.tensor_model_parallel_size=2", "model.micro_batch_size=4")])
def test_the_teacher_is_counted_beside_the_student(over: tuple[str, ...]) -> None:
    from bio_megatron.training import memory
    from bio_megatron.training.distill_memory import check_distill_fits, teacher_estimate

    student, teacher, padded = _models(*over)
    alone = memory.estimate(student, padded, False, 1).total
    tea = teacher_estimate(teacher, padded, torch.float32, student.micro_batch_size, student.encoder_seq_length)
    # the teacher's weights are its parameters in its dtype (no gradients, no Adam state), split by the TP layout
    assert tea.weight_bytes == 4 * memory.parameters_per_rank(teacher, padded)
    assert tea.parameters_per_rank > 100e6 / teacher.tensor_model_parallel_size
    assert tea.activation_bytes > student.micro_batch_size * student.encoder_seq_length * padded // \
        teacher.tensor_model_parallel_size * 4
    memory.check_fits(student, padded, torch.float32, 1, available=(alone, "test memory", 1))  # the student fits
    with pytest.raises(BioMegatronError) as err:
        check_distill_fits(student, padded, torch.float32, teacher, padded, torch.float32, 1,
                           available=(alone + tea.total - 1, "test memory", 1))
    msg = str(err.value)
    assert "\n" not in msg and "student and teacher cannot fit together" in msg and "teacher" in msg
    assert f"{tea.parameters_per_rank:,} parameters" in msg and "trainer.skip_memory_check=true" in msg
    check_distill_fits(student, padded, torch.float32, teacher, padded, torch.float32, 1,
                       available=(alone + tea.total, "test memory", 1))


def test_a_bf16_teacher_needs_half_the_weight_bytes() -> None:
    from bio_megatron.training.distill_memory import teacher_estimate

    student, teacher, padded = _models()
    fp32 = teacher_estimate(teacher, padded, torch.float32, 8, 128)
    bf16 = teacher_estimate(teacher, padded, torch.bfloat16, 8, 128)
    assert bf16.weight_bytes * 2 == fp32.weight_bytes and bf16.activation_bytes < fp32.activation_bytes
