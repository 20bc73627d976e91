"""Export/import with Hugging Face: a TP2xPP2-trained NER checkpoint exports to MegatronBertForTokenClassification
whose logits (and a ``pipeline("token-classification")`` run) equal our model's; importing it back gives the
same logits. Only heads that equal transformers' fixed heads get the plain classes; the others go to the
remote-code classes (``test_export_hf_remote.py``)."""

from __future__ import annotations

from ft_runs import finetune_rank
from harness import run_world

TEXT = "Naloxone reverses the antihypertensive effect of clonidine in rats."
TRAIN = ["trainer.max_steps=6", "model.head.num_fc_layers=1", "model.dataset.max_eval_examples=16",
         "model.dataset.test_file=null", "trainer.val_check_interval=6"]


def _our_logits(ckpt: str, ids, mask):
    import torch

    from bio_megatron.formats.finetuned import load_finetuned

    loaded = load_finetuned(ckpt)
    with torch.no_grad():
        return loaded.model(ids, mask, torch.zeros_like(ids)), loaded.labels


def _export_compare(ckpt: str, out: str, back: str) -> dict:
    import torch
    from transformers import AutoTokenizer, MegatronBertForTokenClassification, pipeline

    from bio_megatron.formats.hf.convert import export_hf, import_hf

    export_hf(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok([TEXT, "Cocaine and lidocaine"], padding=True, return_tensors="pt")
    ours, labels = _our_logits(ckpt, enc["input_ids"], enc["attention_mask"])
    hf = MegatronBertForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(**enc).logits
    valid = enc["attention_mask"].bool()
    pipe = pipeline("token-classification", model=out, tokenizer=out, ignore_labels=[], device="cpu")
    got = pipe(TEXT)
    probs = ours[0].softmax(-1)
    expected = [(labels[int(probs[i + 1].argmax())], float(probs[i + 1].max())) for i in range(len(got))]
    import_hf(out, back)
    again, labels_back = _our_logits(back, enc["input_ids"], enc["attention_mask"])
    from_hf, _ = _our_logits(out, enc["input_ids"], enc["attention_mask"])  # predict/finetune read HF folders too
    return {"diff": (ours - theirs)[valid].abs().max().item(), "scale": ours[valid].abs().max().item(),
            "id2label": [hf.config.id2label[i] for i in range(hf.config.num_labels)], "labels": labels,
            "pipeline": [(g["entity"], g["score"], g["word"]) for g in got], "expected": expected,
            "roundtrip": (again - ours)[valid].abs().max().item(), "labels_back": labels_back,
            "from_hf": (from_hf - ours)[valid].abs().max().item()}


def test_tp2pp2_checkpoint_exports_and_roundtrips(tmp_path):
    run_world(4, finetune_rank, "ner", TRAIN + [f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=tp2pp2",
                                                "model.tensor_model_parallel_size=2",
                                                "model.pipeline_model_parallel_size=2"])
    ckpt = tmp_path / "tp2pp2" / "checkpoints"
    (res,) = run_world(1, _export_compare, str(ckpt), str(tmp_path / "hf"), str(tmp_path / "back"))
    assert res["scale"] > 0.5
    assert res["diff"] < 1e-4, res
    assert res["id2label"] == res["labels"] == res["labels_back"] == ["O", "B-Chemical", "I-Chemical"]
    assert len(res["pipeline"]) >= 10  # every word piece of the sentence
    for (label, score, _), (exp_label, exp_score) in zip(res["pipeline"], res["expected"]):
        assert label == exp_label and abs(score - exp_score) < 1e-4
    assert res["roundtrip"] < 1e-4 and res["from_hf"] < 1e-4
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "label_ids.csv").is_file()


def test_plain_class_only_for_heads_transformers_computes_exactly():
    from bio_megatron.config.finetune import NerModelConfig, QaModelConfig, ReModelConfig
    from bio_megatron.formats.hf.heads import head_settings, plain_class

    def cls(task, m):
        return plain_class(task, head_settings(task, m), m.shape().hidden_size)

    ner, qa, re_ = NerModelConfig(size="tiny"), QaModelConfig(size="tiny"), ReModelConfig(size="tiny")
    assert cls("ner", ner) is None  # the paper's 2-layer relu MLP
    assert cls("re", re_) is None  # relu, not HF's tanh pooler
    assert cls("qa", qa) == "MegatronBertForQuestionAnswering"  # NeMo's QA default: one linear layer
    ner.head.num_fc_layers, ner.fc_hidden_size = 1, 512  # a single layer has no hidden width
    assert cls("ner", ner) == "MegatronBertForTokenClassification"
    re_.classifier_head.activation = "tanh"
    assert cls("re", re_) == "MegatronBertForSequenceClassification"  # tanh pooler + linear
    re_.fc_hidden_size = 64  # = the tiny encoder width: still the pooler's shape
    assert cls("re", re_) == "MegatronBertForSequenceClassification"
    re_.fc_hidden_size = 32
    assert cls("re", re_) is None
