"""``bio-megatron distill`` beyond Megatron BERT, through the real CLI: bio-lm's pair at the tiny size (a RoBERTa
student from a RoBERTa teacher over a byte-level BPE vocabulary: each term logged, the loss falls, the teacher
bit-identical), students of the other families from a Megatron BERT teacher (post-LN BERT, ALBERT, ModernBERT: the
same vocabulary), and ELECTRA, which has no masked-LM head to distil into or from, refused by name (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distill_runs import ROOT, TINY_DISTILL, distill_overrides, distill_rank
from engine.pretrain_runs import overrides
from harness import run_world
from reliability.files import tree_digest

TINY_ROBERTA = ROOT / "nemo_configs" / "pretrain" / "tiny_roberta.yaml"
ROBERTA_DISTILL = ROOT / "nemo_configs" / "distill" / "tiny_roberta_distill.yaml"
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def _checked_steps(run_dir: Path, steps: int) -> dict[int, dict]:
    """The run's logged steps 1..``steps``, each with all three terms positive and the loss their recipe-weighted
    sum (alpha_mlm 5, alpha_kl 2, alpha_cos 1)."""
    recs = _records(run_dir)
    assert sorted(recs) == list(range(1, steps + 1))
    for r in recs.values():
        assert r["mlm_loss"] > 0 and r["kl_loss"] > 0 and r["cos_loss"] > 0
        assert r["loss"] == pytest.approx(5.0 * r["mlm_loss"] + 2.0 * r["kl_loss"] + r["cos_loss"], rel=1e-5)
    return recs


def _pretrain(recipe: str, over: list[str]) -> str:
    import os

    import torch.distributed as dist

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    status = run_pretraining(load_pretrain_config(Path(recipe), over, world_size=int(os.environ["WORLD_SIZE"])))
    dist.barrier()
    return status


def distill_cli(argv: list[str]) -> dict:
    """``bio-megatron distill argv`` in this forked rank, the teacher the CLI builds kept and compared after the
    run with its weights as they were loaded (a spy on loading/teacher.load_teacher, which the CLI calls)."""
    import torch

    import bio_megatron.loading.teacher as teacher_module
    from reliability.cli_log import run_cli

    real, held = teacher_module.load_teacher, {}

    def keep(*args):
        held["teacher"] = teacher = real(*args)
        held["loaded"] = {k: v.detach().clone() for k, v in teacher.state_dict().items() if torch.is_tensor(v)}
        return teacher

    teacher_module.load_teacher = keep
    try:
        rc, msg = run_cli(argv)
    finally:
        teacher_module.load_teacher = real
    teacher = held.get("teacher")
    after = teacher.state_dict() if teacher is not None else {}
    return {"rc": rc, "msg": msg,
            "identical": teacher is not None and all(torch.equal(after[k], v) for k, v in held["loaded"].items()),
            "no_grad": teacher is not None and all(not p.requires_grad and p.grad is None
                                                   for p in teacher.parameters()),
            "teacher_family": type(teacher).__name__ if teacher is not None else None}


@pytest.fixture(scope="module")
def bpe(pubmed_prefix, tmp_path_factory) -> dict:
    """A 2,000-token byte-level BPE vocabulary learnt from the bundled corpus and the corpus tokenized with it
    (as the roberta recipes prepare their data)."""
    from bio_megatron.cli import main

    data, root = Path(pubmed_prefix).parent, tmp_path_factory.mktemp("roberta_distill")
    vocab, prefix = root / "bpe_vocab", root / "pubmed_pmc_bpe"
    inputs = [str(data / "pubmed.jsonl"), str(data / "pmc.jsonl")]
    assert main(["vocab", "train", "--type", "bpe", "--size", "2000", "--input", *inputs, "--output", str(vocab)]) == 0
    assert main(["data", "tokenize", "--input", *inputs, "--vocab", str(vocab), "--output-prefix", str(prefix),
                 "--workers", "1"]) == 0
    return {"root": root, "vocab": vocab, "prefix": prefix}


@pytest.fixture(scope="module")
def roberta(bpe) -> dict:
    """A tiny_roberta teacher (4 layers x 64, 6 steps) and a RoBERTa student (2 x 32) distilled from it for 6 steps
    by the CLI."""
    root, vocab = bpe["root"], f"model.tokenizer.vocab_file={bpe['vocab']}"
    teacher_over = overrides(bpe["prefix"], root, "teacher", steps=6, save_last=True, extra=(vocab,))
    assert run_world(1, _pretrain, str(TINY_ROBERTA), teacher_over, timeout=300) == ["finished"]
    teacher = root / "teacher"
    before = tree_digest(teacher)
    over = distill_overrides(bpe["prefix"], root, "student", teacher, steps=6, save_last=True,
                             extra=(vocab, "model.optim.lr=5e-3", "model.optim.sched.warmup_ratio=0"))
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(ROBERTA_DISTILL), *over], timeout=300)
    return {**res, "teacher": teacher, "student": root / "student", "digest_same": tree_digest(teacher) == before}


def test_a_roberta_student_learns_from_a_roberta_teacher(roberta) -> None:
    assert roberta["rc"] == 0, roberta["msg"]
    recs = _checked_steps(roberta["student"], 6)
    assert recs[6]["loss"] < recs[1]["loss"] and recs[6]["kl_loss"] < recs[1]["kl_loss"]
    meta = json.loads((roberta["student"] / "checkpoints" / "iter_0000006" / "bio_megatron.json").read_text())
    teacher_meta = json.loads((roberta["teacher"] / "checkpoints" / "iter_0000006" / "bio_megatron.json").read_text())
    assert meta["family"] == teacher_meta["family"] == "roberta"
    assert meta["distilled_from"] == str(roberta["teacher"])


def test_the_roberta_teacher_is_bit_identical_and_frozen(roberta) -> None:
    assert roberta["rc"] == 0, roberta["msg"]
    assert roberta["identical"] and roberta["no_grad"] and roberta["digest_same"]


def test_roberta_distillation_at_tp2_equals_tp1(roberta, bpe) -> None:
    """Both RoBERTas split over two ranks (the BPE vocabulary's KL on each rank's slice): every step's terms equal
    the TP1 run's within 1e-5 (dropout off)."""
    over = distill_overrides(bpe["prefix"], bpe["root"], "student_tp2", roberta["teacher"], tp=2, steps=6,
                             extra=(f"model.tokenizer.vocab_file={bpe['vocab']}", "model.optim.lr=5e-3",
                                    "model.optim.sched.warmup_ratio=0"))
    assert run_world(2, distill_rank, over, ROBERTA_DISTILL, timeout=300) == ["finished", "finished"]
    tp1, tp2 = _records(roberta["student"]), _records(bpe["root"] / "student_tp2")
    assert sorted(tp2) == sorted(tp1) == [1, 2, 3, 4, 5, 6]
    terms = ("loss", "mlm_loss", "kl_loss", "cos_loss")
    assert [(s, k, tp1[s][k], tp2[s][k]) for s in tp1 for k in terms if abs(tp1[s][k] - tp2[s][k]) > 1e-5] == []


def test_a_roberta_teacher_exported_to_hugging_face_teaches_as_its_checkpoint(roberta, bpe) -> None:
    """RobertaForMaskedLM written by ``export hf`` and read back as the teacher: step 1's terms equal those of the
    run above (same student, data and seed; the teacher from its checkpoint)."""
    from harness import cli_forked

    hf = bpe["root"] / "teacher_hf"
    res = cli_forked(["export", "hf", "--checkpoint", str(roberta["teacher"]), "--out", str(hf)], timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads((hf / "config.json").read_text())["model_type"] == "roberta"
    over = distill_overrides(bpe["prefix"], bpe["root"], "student_hf", hf, steps=1,
                             extra=(f"model.tokenizer.vocab_file={bpe['vocab']}", "model.optim.lr=5e-3",
                                    "model.optim.sched.warmup_ratio=0"))
    (r,) = run_world(1, distill_cli, ["distill", "--config", str(ROBERTA_DISTILL), *over], timeout=300)
    assert r["rc"] == 0, r["msg"]
    ours, theirs = _records(roberta["student"])[1], _records(bpe["root"] / "student_hf")[1]
    terms = ("loss", "mlm_loss", "kl_loss", "cos_loss")
    assert {k: theirs[k] for k in terms} == pytest.approx({k: ours[k] for k in terms}, abs=1e-5)


# Students of the other families from the Megatron BERT (pre-LN) teacher, over the same WordPiece vocabulary
STUDENTS = {
    "bert_post_ln": ("model.transformer_block_type=post_ln",),
    "albert": ("model.family=albert", "model.transformer_block_type=post_ln", "model.embedding_size=16",
               "model.hidden_act=gelu_new"),
    "modernbert": ("model.family=modernbert", "model.num_tokentypes=0", "model.ffn_hidden_size=48",
                   "model.local_attention=16", "model.global_attn_every_n_layers=2", "model.layernorm_epsilon=1e-5"),
}


@pytest.mark.parametrize("family", sorted(STUDENTS))
def test_a_student_of_another_family_learns_from_a_megatron_bert_teacher(family: str, pubmed_prefix,
                                                                          distill_teacher, tmp_path) -> None:
    over = distill_overrides(pubmed_prefix, tmp_path, "student", distill_teacher, steps=3, save_last=True,
                             extra=STUDENTS[family])
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), *over], timeout=300)
    assert res["rc"] == 0, res["msg"]
    assert res["identical"] and res["no_grad"]
    _checked_steps(tmp_path / "student", 3)
    meta = json.loads((tmp_path / "student" / "checkpoints" / "iter_0000003" / "bio_megatron.json").read_text())
    assert meta["family"] == {"bert_post_ln": "bert"}.get(family, family)


def test_a_roberta_student_refuses_a_teacher_over_another_vocabulary(bpe, distill_teacher, tmp_path) -> None:
    """Across vocabularies nothing runs: the RoBERTa student (BPE) refuses the Megatron BERT teacher (WordPiece)."""
    over = distill_overrides(bpe["prefix"], tmp_path, "student", distill_teacher,
                             extra=(f"model.tokenizer.vocab_file={bpe['vocab']}",))
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(ROBERTA_DISTILL), *over], timeout=300)
    assert res["rc"] == 2 and "not the student's" in res["msg"] and len(res["msg"].splitlines()) <= 2, res["msg"]
    assert not (tmp_path / "student").exists()


def test_an_electra_student_is_refused_by_name_at_config_time(pubmed_prefix, distill_teacher, tmp_path) -> None:
    over = distill_overrides(pubmed_prefix, tmp_path, "student", distill_teacher,
                             extra=("model.objective=electra", "model.transformer_block_type=post_ln"))
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), *over], timeout=120)
    assert res["rc"] == 2 and "ELECTRA" in res["msg"] and res["teacher_family"] is None, res["msg"]
    assert not (tmp_path / "student").exists()


@pytest.mark.parametrize("family", ["albert", "modernbert"])
def test_a_student_of_another_family_at_tp2_equals_tp1(family: str, pubmed_prefix, distill_teacher,
                                                       tmp_path) -> None:
    """ALBERT's factorised embedding and ModernBERT's GeGLU / local attention split over two ranks with the
    Megatron BERT teacher: every step's terms equal TP1's within 1e-5 (dropout off)."""
    for tp in (1, 2):
        over = distill_overrides(pubmed_prefix, tmp_path, f"tp{tp}", distill_teacher, tp=tp, steps=3,
                                 extra=STUDENTS[family])
        assert run_world(tp, distill_rank, over, timeout=300) == ["finished"] * tp
    tp1, tp2 = _records(tmp_path / "tp1"), _records(tmp_path / "tp2")
    assert sorted(tp1) == sorted(tp2) == [1, 2, 3]
    terms = ("loss", "mlm_loss", "kl_loss", "cos_loss")
    assert [(s, k, tp1[s][k], tp2[s][k]) for s in tp1 for k in terms if abs(tp1[s][k] - tp2[s][k]) > 1e-5] == []


# Teachers of the other families (each its tiny recipe pretrained 3 steps) for a Megatron BERT (pre-LN) student
TEACHERS = ("tiny_post_ln", "tiny_albert", "tiny_modernbert")


# the default suite keeps the RoBERTa teacher exported to HF (test_a_roberta_teacher_exported_to_hugging_face_...)
@pytest.mark.parametrize("recipe", [pytest.param(r, marks=pytest.mark.extended) for r in TEACHERS])
def test_a_megatron_bert_student_learns_from_a_teacher_of_another_family(recipe: str, pubmed_prefix,
                                                                          tmp_path) -> None:
    teacher_over = overrides(pubmed_prefix, tmp_path, "teacher", steps=3, save_last=True)
    path = ROOT / "nemo_configs" / "pretrain" / f"{recipe}.yaml"
    assert run_world(1, _pretrain, str(path), teacher_over, timeout=300) == ["finished"]
    teacher = tmp_path / "teacher"
    before = tree_digest(teacher)
    over = distill_overrides(pubmed_prefix, tmp_path, "student", teacher, steps=3, save_last=True)
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), *over], timeout=300)
    assert res["rc"] == 0, res["msg"]
    assert res["identical"] and res["no_grad"] and tree_digest(teacher) == before
    recs = _checked_steps(tmp_path / "student", 3)
    meta = json.loads((tmp_path / "student" / "checkpoints" / "iter_0000003" / "bio_megatron.json").read_text())
    assert meta["family"] == "megatron_bert"
    # the same teacher as a Hugging Face folder (export hf: BertForMaskedLM, AlbertForMaskedLM, ModernBertForMaskedLM)
    from harness import cli_forked

    hf = tmp_path / "teacher_hf"
    exported = cli_forked(["export", "hf", "--checkpoint", str(teacher), "--out", str(hf)], timeout=300)
    assert exported.returncode == 0, exported.stderr
    over = distill_overrides(pubmed_prefix, tmp_path, "student_hf", hf, steps=1)
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), *over], timeout=300)
    assert res["rc"] == 0, res["msg"]
    first = _records(tmp_path / "student_hf")[1]
    terms = ("loss", "mlm_loss", "kl_loss", "cos_loss")
    assert {k: first[k] for k in terms} == pytest.approx({k: recs[1][k] for k in terms}, abs=1e-5)


def test_an_electra_teacher_is_refused_by_name_before_any_weight_is_read(pubmed_prefix, tmp_path) -> None:
    teacher_over = overrides(pubmed_prefix, tmp_path, "teacher", steps=1, save_last=True)
    path = ROOT / "nemo_configs" / "pretrain" / "tiny_electra.yaml"
    assert run_world(1, _pretrain, str(path), teacher_over, timeout=300) == ["finished"]
    over = distill_overrides(pubmed_prefix, tmp_path, "student", tmp_path / "teacher")
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), "--dry-run", *over], timeout=120)
    assert res["rc"] == 2 and "is an ELECTRA model" in res["msg"] and len(res["msg"].splitlines()) <= 2, res["msg"]
    (res,) = run_world(1, distill_cli, ["distill", "--config", str(TINY_DISTILL), *over], timeout=120)
    assert res["rc"] == 2 and "is an ELECTRA model" in res["msg"] and res["teacher_family"] is None, res["msg"]
    assert not (tmp_path / "student").exists()
