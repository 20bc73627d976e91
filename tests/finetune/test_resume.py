"""Preemption: a fine-tuning run stopped by SIGTERM-equivalent at step 3 and rerun with the same name continues
exactly (dropout on: RNG, optimizer, scheduler, data position and best-so-far restored) and ends like an
uninterrupted run; a finished sweep seed is not run again."""

from __future__ import annotations

from ft_runs import finetune_rank
from harness import run_world

OVER = ["trainer.max_steps=6", "trainer.val_check_interval=2", "model.dataset.max_eval_examples=16",
        "model.dataset.test_file=null", "model.head.fc_dropout=0.3", "model.hidden_dropout=0.1"]


def _interrupted(over: list[str], stop_after: int) -> dict:
    """The real run with the stop flag raised after ``stop_after`` optimizer steps (as a signal would)."""
    import bio_megatron.tasks.finetune as ft
    from bio_megatron.training.signals import StopRequest

    class StopAt(StopRequest):
        calls = 0

        def agreed(self) -> bool:
            StopAt.calls += 1
            return StopAt.calls >= stop_after or super().agreed()

    ft.StopRequest = StopAt
    return finetune_rank("ner", over)


def test_preempted_finetuning_resumes_exactly(tmp_path):
    ref = run_world(2, finetune_rank, "ner", OVER + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ref",
                                                     "model.tensor_model_parallel_size=2"])[0]
    over = OVER + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=cut", "model.tensor_model_parallel_size=2"]
    first = run_world(2, _interrupted, over, 3)[0]
    assert first["status"] == "interrupted" and len(first["losses"]) == 3
    assert (tmp_path / "cut" / "resume" / "latest").is_file()
    second = run_world(2, finetune_rank, "ner", over)[0]
    assert second["status"] == "finished" and second["losses"] == ref["losses"]
    assert second["dev"]["f1"] == ref["dev"]["f1"] and second["best_step"] == ref["best_step"]
    assert not (tmp_path / "cut" / "resume").exists()
