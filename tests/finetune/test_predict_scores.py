"""``predict classify`` puts the model's confidence beside each prediction: single-label (DDI) the softmax
``probability`` of the predicted label and ``probabilities`` of all labels, equal to what transformers'
``pipeline("text-classification", top_k=None)`` gives on the exported folder; multi-label (HoC) the sigmoid of
every label, the labels above 0.5 being ``labels``. ``bio-megatron evaluate`` still reads the file. The export's
model card carries the run's dev and test scores. (NER entity scores: test_export_pipeline.py.)"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml
from harness import cli_forked, run_world

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "blurb"
RECIPE = ROOT / "nemo_configs" / "classify" / "tiny_classify.yaml"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
# task_name -> (fixture folder, overrides): DDI with the head transformers computes (exports), HoC NeMo's
RUNS = {"ddi": ("DDI", ["model.transformer_block_type=post_ln"]), "hoc": ("HoC", [])}


def _finetune(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    return run_finetuning(load_finetune_config("classify", RECIPE, over, int(os.environ["WORLD_SIZE"])))


def _cli(*argv: str) -> str:
    done = cli_forked(list(argv), env=OFFLINE)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _run(task_name: str, tmp: Path) -> tuple[dict, Path, list[dict]]:
    folder, extra = RUNS[task_name]
    gold = FIXTURES / folder / "test.tsv"
    over = ["trainer.max_steps=4", "trainer.val_check_interval=4", f"model.dataset.task_name={task_name}",
            f"model.dataset.data_dir={gold.parent}", f"exp_manager.exp_dir={tmp}", f"exp_manager.name={task_name}",
            *extra]
    (res,) = run_world(1, _finetune, over)
    pred = tmp / "pred.jsonl"
    _cli("predict", "classify", "--checkpoint", res["checkpoint"], "--input", str(gold), "--out", str(pred))
    scored = json.loads(_cli("evaluate", task_name, "--gold", str(gold), "--pred", str(pred)))
    assert scored["metric"] == "micro_f1"  # evaluate reads its own key and ignores the probabilities
    return res, gold, [json.loads(line) for line in pred.read_text().splitlines()]


def _pipeline_scores(folder: str, texts: list[str]) -> list[dict[str, float]]:
    """transformers' own ``pipeline("text-classification", top_k=None)`` on the folder alone, offline: every
    label's score per text (run in a forked process: :func:`run_world`)."""
    import huggingface_hub.constants
    from transformers import pipeline

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    pipe = pipeline("text-classification", model=folder, top_k=None, device="cpu")
    return [{r["label"]: float(r["score"]) for r in out} for out in pipe(texts)]


def test_single_label_probabilities_equal_transformers_pipeline(tmp_path):
    from bio_megatron.tasks.classify_data import dataset

    res, gold, preds = _run("ddi", tmp_path)
    labels = dataset("ddi").labels
    assert len(preds) == 8
    for p in preds:
        probs = p["probabilities"]
        assert list(probs) == list(labels) and abs(sum(probs.values()) - 1) < 1e-4
        assert p["label"] == max(probs, key=probs.get) and p["probability"] == probs[p["label"]]
    _cli("export", "hf", "--checkpoint", res["checkpoint"], "--out", str(tmp_path / "hf"))
    texts = [line.split("\t")[1] for line in gold.read_text(encoding="utf-8").splitlines()]
    (theirs,) = run_world(1, _pipeline_scores, str(tmp_path / "hf"), texts)
    for p, t in zip(preds, theirs):
        assert set(t) == set(labels) and all(abs(p["probabilities"][k] - t[k]) < 1e-4 for k in t), (p, t)

    meta = yaml.safe_load((tmp_path / "hf" / "README.md").read_text().split("---\n")[1])
    assert meta["pipeline_tag"] == "text-classification" and meta["datasets"] == ["ddi"]
    splits = {r["dataset"]["split"]: {m["type"]: m["value"] for m in r["metrics"]}
              for r in meta["model-index"][0]["results"]}
    assert set(splits) == {"validation", "test"}
    assert abs(splits["test"][res["test"]["metric"]] - res["test"]["score"]) < 1e-4  # the BLURB headline


def _sigmoids(ckpt: str, gold: str) -> list[tuple[str, list[float]]]:
    """Each example alone through our model (no padding): (id, sigmoid of every label's logit)."""
    import torch

    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict.classify import load_classifier, read_examples
    from bio_megatron.tasks.classify_data import encode

    single_process()
    loaded = load_classifier(ckpt)
    examples = read_examples(gold, loaded.cfg.model.dataset)
    out = []
    for e, (ids, types) in zip(examples, encode(examples, loaded.tokenizer, 128)):
        with torch.no_grad():
            logits = loaded.model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                                  torch.tensor([types]))[0]
        out.append((e.id, [1 / (1 + math.exp(-float(x))) for x in logits]))
    return out


def test_multi_label_gets_a_sigmoid_per_label(tmp_path):
    from bio_megatron.tasks.classify_data import dataset

    res, gold, preds = _run("hoc", tmp_path)
    labels = dataset("hoc").labels
    (want,) = run_world(1, _sigmoids, res["checkpoint"], str(gold))
    assert [p["id"] for p in preds] == [i for i, _ in want]
    for p, (_, sig) in zip(preds, want):
        probs = p["probabilities"]
        assert list(probs) == list(labels)
        assert p["labels"] == [j for j, t in enumerate(labels) if probs[t] > 0.5]
        assert max(abs(probs[t] - w) for t, w in zip(labels, sig)) < 1e-4, (probs, sig)
