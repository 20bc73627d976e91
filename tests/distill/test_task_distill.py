"""Task-specific distillation (``finetune ner`` with ``model.teacher.restore_from_path`` = a fine-tuned NER
teacher): the loss on the real models' logits equals alpha_task x the token cross entropy + alpha_kl x T^2 x KL
computed independently (``torch.distributions``); TP2 = TP1 per step within 1e-5; the teacher is forward-only
(bit-identical after training, no gradients, eval mode, never in the optimizer); bad teachers are one line, exit 2,
nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness import run_world
from reliability.files import tree_digest
from task_runs import (DATA, ROOT, TINY_NER_DISTILL, cli, distil_and_record, distil_rank, make_ner_teacher,
                       run_overrides)
from torch.distributions import Categorical, kl_divergence


@pytest.fixture(scope="module")
def ner(tmp_path_factory) -> dict:
    """The fine-tuned teacher and one TP1 distillation of 3 steps that records what its loss read."""
    root = tmp_path_factory.mktemp("task_distill")
    teacher = make_ner_teacher(root)
    (tp1,) = run_world(1, distil_and_record, run_overrides(root, "tp1", teacher))
    return {"root": root, "teacher": teacher, "tp1": tp1}


def test_the_loss_is_the_task_loss_plus_the_kl_of_the_teachers_label_distributions(ner) -> None:
    calls = ner["tp1"]["calls"]
    assert len(calls) == 2 and {c["kind"] for c in calls} == {"tokens"}
    for c in calls:
        s, t, labels = torch.tensor(c["student"]), torch.tensor(c["teacher"]), torch.tensor(c["labels"])
        d = c["settings"]
        assert s.shape[-1] == t.shape[-1] == 3 and not torch.equal(s, t)  # the 4x64 teacher's own logits
        task = torch.nn.functional.cross_entropy(s.reshape(-1, 3).double(), labels.reshape(-1), ignore_index=-100)
        at = labels != -100
        T = d["temperature"]
        kl = kl_divergence(Categorical(logits=t[at].double() / T), Categorical(logits=s[at].double() / T)).mean()
        want = d["alpha_task"] * float(task) + d["alpha_kl"] * T * T * float(kl)
        assert c["loss"] == pytest.approx(want, rel=1e-5)
        assert float(kl) > 1e-4  # the KL term is really there


def test_each_term_is_logged_and_the_loss_is_their_weighted_sum(ner) -> None:
    import json

    recs = [r for r in map(json.loads, (ner["root"] / "tp1" / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]
    assert [r["step"] for r in recs] == [1, 3]  # tiny_ner logs every 10 steps: the first and the last
    for r in recs:  # tiny_ner_distill: alpha_task 1.0, alpha_kl 1.0
        assert r["task_loss"] > 0 and r["kl_loss"] > 0
        assert r["loss"] == pytest.approx(r["task_loss"] + r["kl_loss"], rel=1e-5)
    dev = [r for r in map(json.loads, (ner["root"] / "tp1" / "metrics.jsonl").read_text().splitlines())
           if "val_loss" in r]
    assert dev and all("kl_loss" not in r for r in dev)  # evaluation is the student's task loss alone


def test_tp2_equals_tp1(ner) -> None:
    tp2 = run_world(2, distil_rank, run_overrides(ner["root"], "tp2", ner["teacher"],
                                                  "model.tensor_model_parallel_size=2"))
    assert len(ner["tp1"]["losses"]) == 3
    for losses in tp2:
        assert max(abs(a - b) for a, b in zip(losses, ner["tp1"]["losses"])) < 1e-5, (losses, ner["tp1"]["losses"])


def test_the_teacher_is_forward_only_and_bit_identical_after_training(ner) -> None:
    r = ner["tp1"]["teacher"]
    assert r == {"identical": True, "no_grad": True, "eval_mode": True, "in_optimizer": 0, "stepped": r["stepped"]}
    assert r["stepped"] > 0


CASES = {  # extra overrides (or another task), what the one line says
    "other_labels": (("model.dataset.data_dir=" + str(ROOT / "tests" / "fixtures" / "ner"),
                      "model.dataset.train_file=bc5cdr_disease_devel_head.tsv",
                      "model.dataset.dev_file=bc5cdr_disease_devel_head.tsv"),
                     ["the teacher's labels ['O', 'B-Chemical', 'I-Chemical'] are not the student's",
                      "'B-Disease'"]),
    "other_vocabulary": (("model.tokenizer.vocab_file=bert_base_uncased",), ["its vocabulary", "not the student's"]),
    "pipeline": (("model.pipeline_model_parallel_size=2",), ["must be 1 for task-specific distillation"]),
    "other_task": ((), ["is a fine-tuned ner model; finetune qa distils from a teacher fine-tuned on qa"]),
    "no_teacher_there": ((), ["model.teacher.restore_from_path: "]),
    "regression": ((), ["classify biosses is a regression task", "not a distribution to distil"]),
    "other_labels_dry_run": (("--dry-run", "model.dataset.data_dir=" + str(ROOT / "tests" / "fixtures" / "ner"),
                              "model.dataset.train_file=bc5cdr_disease_devel_head.tsv",
                              "model.dataset.dev_file=bc5cdr_disease_devel_head.tsv"),
                             ["the teacher's labels ['O', 'B-Chemical', 'I-Chemical'] are not the student's"]),
    "other_vocabulary_dry_run": (("--dry-run", "model.tokenizer.vocab_file=bert_base_uncased"), ["not the student's"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_teacher_is_one_line_exit_2_and_nothing_written(case: str, ner, tmp_path: Path) -> None:
    extra, expected = CASES[case]
    teacher = tmp_path / "nowhere" if case == "no_teacher_there" else ner["teacher"]
    before = tree_digest(ner["teacher"])
    if case == "other_task":
        argv = ["finetune", "qa", "--config", "tiny_qa", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=run",
                "trainer.max_steps=1", f"model.teacher.restore_from_path={teacher}"]
    elif case == "regression":
        argv = ["finetune", "classify", "--config", "tiny_classify", f"exp_manager.exp_dir={tmp_path}",
                "exp_manager.name=run", "trainer.max_steps=1", "model.dataset.task_name=biosses",
                f"model.dataset.data_dir={ROOT / 'tests' / 'fixtures' / 'blurb' / 'BIOSSES'}",
                f"model.teacher.restore_from_path={teacher}"]
    else:
        flags = [e for e in extra if e.startswith("--")]
        argv = ["finetune", "ner", "--config", str(TINY_NER_DISTILL), *flags,
                *run_overrides(tmp_path, "run", teacher, *(e for e in extra if e not in flags))]
    (rc, msg), = run_world(1, cli, argv)
    assert rc == 2, msg
    assert all(e in msg for e in expected), msg
    assert "--dry-run" not in argv or not (tmp_path / "run").exists()
    assert "\n" not in msg.strip() or case == "pipeline", msg
    assert not (tmp_path / "run").exists()
    assert tree_digest(ner["teacher"]) == before and DATA.is_dir()


def test_a_hugging_face_task_teacher_teaches_as_its_checkpoint(ner, tmp_path: Path) -> None:
    """The teacher exported with ``export hf`` (MegatronBertForTokenClassification, its id2label) and read back by
    loading/: the same losses per step as with the checkpoint it came from."""
    hf = tmp_path / "teacher_hf"
    (rc, msg), = run_world(1, cli, ["export", "hf", "--checkpoint", str(ner["teacher"]), "--out", str(hf)])
    assert rc == 0, msg
    (losses,) = run_world(1, distil_rank, run_overrides(ner["root"], "hf_teacher", hf))
    assert max(abs(a - b) for a, b in zip(losses, ner["tp1"]["losses"])) < 1e-5, (losses, ner["tp1"]["losses"])


def test_dry_run_checks_a_good_teacher_and_writes_nothing(ner, tmp_path: Path) -> None:
    argv = ["finetune", "ner", "--config", str(TINY_NER_DISTILL), "--dry-run",
            *run_overrides(tmp_path, "run", ner["teacher"])]
    (rc, msg), = run_world(1, cli, argv)
    assert rc == 0, msg
    assert not (tmp_path / "run").exists()


def _task_rank(task: str, over: list[str]) -> dict:
    """``finetune <task>`` on its tiny recipe (classify: HoC, multi-label, or DDI, single-label)."""
    import os

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    name = "classify" if task in ("hoc", "ddi") else task
    recipe = ROOT / "nemo_configs" / name / f"tiny_{name}.yaml"
    res = run_finetuning(load_finetune_config(name, recipe, over, int(os.environ["WORLD_SIZE"])))
    return {"checkpoint": res["checkpoint"], "losses": [h["loss"] for h in res["history"] if "loss" in h]}


OTHER = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "model.dataset.max_eval_examples=8"]
CLASSIFY = {"hoc": ["model.dataset.task_name=hoc", f"model.dataset.data_dir={ROOT / 'tests/fixtures/blurb/HoC'}"],
            "ddi": ["model.dataset.task_name=ddi", f"model.dataset.data_dir={ROOT / 'tests/fixtures/blurb/DDI'}"]}


# RE is extended: DDI checks the same per-example label distribution in the default suite
@pytest.mark.parametrize("task", ["qa", pytest.param("re", marks=pytest.mark.extended), "hoc", "ddi"])
def test_other_tasks_distil_with_tp2_equal_to_tp1(task: str, tmp_path: Path) -> None:
    """QA (start and end logits over the real tokens), RE and DDI (a label distribution per example) and HoC (a
    Bernoulli per label) end to end on their tiny recipes: a 2-layer student of a fine-tuned 4-layer teacher; the
    teacher changes the losses, TP2 = TP1."""
    base = [*OTHER, *CLASSIFY.get(task, []), f"exp_manager.exp_dir={tmp_path}"]
    (teacher,) = run_world(1, _task_rank, task, [*base, "exp_manager.name=t"])
    student = [*base, "model.num_layers=2"]
    (alone,) = run_world(1, _task_rank, task, [*student, "exp_manager.name=alone"])
    with_teacher = [*student, f"model.teacher.restore_from_path={teacher['checkpoint']}"]
    (tp1,) = run_world(1, _task_rank, task, [*with_teacher, "exp_manager.name=tp1"])
    tp2 = run_world(2, _task_rank, task, [*with_teacher, "exp_manager.name=tp2", "model.tensor_model_parallel_size=2"])
    assert len(tp1["losses"]) == 3 and abs(tp1["losses"][0] - alone["losses"][0]) > 1e-4, (tp1, alone)  # KL in
    for r in tp2:
        assert max(abs(a - b) for a, b in zip(r["losses"], tp1["losses"])) < 1e-5, (r["losses"], tp1["losses"])
