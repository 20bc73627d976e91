"""Heads transformers has no class for (the paper's MLPs) export as remote-code ``BioMegatronFor*`` folders.

Checkpoints fine-tuned at TP2xPP2 (NER), TP2 (QA) and PP2 (RE) with multi-layer heads export to folders whose
``AutoModelFor*.from_pretrained(trust_remote_code=True)`` logits and losses, and ``pipeline()`` outputs
(token and text classification; transformers 5 has no QA pipeline, so ``predict qa`` from the folder), equal
our model's, offline; ``import hf`` and ``predict`` read the folder back, and export -> import -> export is exact.
Bad ``bio_megatron_head`` settings fail naming the value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ft_runs import finetune_rank
from harness import run_world

QUICK = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
         "model.dataset.test_file=null"]
# task -> (layout overrides, world size, head overrides): the paper's head shapes at tiny widths; PyTorch's
# Linear init gives logits of order 1 after 3 steps, so that 1e-4 is a tight bound.
CASES = {
    "ner": (["model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=2"], 4,
            ["model.head.num_fc_layers=2", "model.fc_hidden_size=32", "model.head.activation=relu",
             "model.head.use_transformer_init=false"]),
    "qa": (["model.tensor_model_parallel_size=2"], 2,
           ["model.head.num_fc_layers=2", "model.fc_hidden_size=48", "model.head.activation=gelu",
            "model.head.use_transformer_init=false", "model.dataset.version_2_with_negative=false"]),
    "re": (["model.pipeline_model_parallel_size=2"], 2,
           ["model.classifier_head.num_output_layers=3", "model.fc_hidden_size=32",
            "model.classifier_head.activation=relu", "model.classifier_head.use_transformer_init=false"]),
}
AUTO = {"ner": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering",
        "re": "AutoModelForSequenceClassification"}
TEXT = "Naloxone reverses the antihypertensive effect of clonidine in rats."
QUESTION = "What reverses the effect of clonidine?"
CONTEXT = "Naloxone reverses the antihypertensive effect of clonidine."


def _logits(model, enc):
    """Our model's output on an HF tokenizer's batch (QA: [b, s, 2] start/end)."""
    import torch

    with torch.no_grad():
        return model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])


def _hf_logits(task: str, out):
    import torch

    return torch.stack([out.start_logits, out.end_logits], -1) if task == "qa" else out.logits


def _check(task: str, ckpt: str, out: str, back: str, again: str) -> dict:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file
    from transformers import dynamic_module_utils

    from bio_megatron.formats.hf import modeling as hf_modeling
    from bio_megatron.formats.hf.convert import export_hf, import_hf
    from bio_megatron.formats.finetuned import load_finetuned

    info = export_hf(ckpt, out)
    ours_model = load_finetuned(ckpt).model
    auto_cls = getattr(transformers, AUTO[task])
    hf = auto_cls.from_pretrained(out, trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    if task == "qa":
        enc = tok([QUESTION, "Which drug?"], [CONTEXT, "Cocaine and lidocaine were given."], padding=True,
                  return_tensors="pt")
    else:
        enc = tok([TEXT, "Cocaine and @CHEMICAL$ inhibit @GENE$"], padding=True, return_tensors="pt")
    ours = _logits(ours_model, enc)
    valid = enc["attention_mask"].bool()
    with torch.no_grad():
        theirs = _hf_logits(task, hf(**enc))
        # losses follow transformers' conventions (-100 ignored; QA positions past the sequence ignored)
        if task == "ner":
            labels = torch.where(valid, torch.randint(0, ours.shape[-1], valid.shape), -100)
            loss, expected_loss = hf(**enc, labels=labels).loss, F.cross_entropy(ours.flatten(0, 1), labels.flatten())
        elif task == "re":
            labels = torch.tensor([1, 0])
            loss, expected_loss = hf(**enc, labels=labels).loss, F.cross_entropy(ours, labels)
        else:
            start, end = torch.tensor([3, 999]), torch.tensor([5, 999])  # the second example is ignored
            loss = hf(**enc, start_positions=start, end_positions=end).loss
            expected_loss = (F.cross_entropy(ours[:1, :, 0], start[:1]) + F.cross_entropy(ours[:1, :, 1], end[:1])) / 2
    if task == "re":
        diff, scale = (ours - theirs).abs().max().item(), ours.abs().max().item()
    else:
        diff, scale = (ours - theirs)[valid].abs().max().item(), ours[valid].abs().max().item()
    res = {"info": info, "diff": diff, "scale": scale, "loss_diff": abs(loss.item() - expected_loss.item()),
           "hf_class": type(hf).__name__, "config": json.loads((Path(out) / "config.json").read_text()),
           "same_code": (Path(out) / "modeling_bio_megatron.py").read_bytes()
           == Path(hf_modeling.__file__).read_bytes(),
           "imports": dynamic_module_utils.get_imports(f"{out}/modeling_bio_megatron.py")}

    # pipeline() with the folder alone, offline
    if task == "ner":
        pipe = transformers.pipeline("token-classification", model=out, trust_remote_code=True, ignore_labels=[],
                                     device="cpu")
        got = pipe(TEXT)
        probs = _logits(ours_model, tok([TEXT], return_tensors="pt"))[0].softmax(-1)
        labels = hf.config.id2label
        res["pipeline"] = [(g["entity"], g["score"]) for g in got]
        res["expected"] = [(labels[int(probs[g["index"]].argmax())], float(probs[g["index"]].max())) for g in got]
    elif task == "re":
        pipe = transformers.pipeline("text-classification", model=out, trust_remote_code=True, device="cpu")
        got = pipe(TEXT)[0]
        probs = _logits(ours_model, tok([TEXT], return_tensors="pt"))[0].softmax(-1)
        res["pipeline"] = [(got["label"], got["score"])]
        res["expected"] = [(hf.config.id2label[int(probs.argmax())], float(probs.max()))]
    else:  # transformers 5 has no question-answering pipeline: `predict qa` from the folder = from the checkpoint
        from bio_megatron.predict.qa import answer
        from bio_megatron.tasks.qa_data import QAExample

        examples = [QAExample("a", QUESTION, CONTEXT), QAExample("b", "Which drug?", "Cocaine and lidocaine.")]
        from_ckpt, from_hf = load_finetuned(ckpt), load_finetuned(out)
        from_hf.cfg.model.dataset = from_ckpt.cfg.model.dataset  # an HF folder carries no SQuAD settings
        res["qa_ckpt"], res["qa_hf"] = answer(from_ckpt, examples), answer(from_hf, examples)

    # without trust_remote_code: a loud error, not transformers' plain head with random weights
    dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0  # no interactive prompt
    try:
        auto_cls.from_pretrained(out)
        res["untrusted"] = "loaded"
    except ValueError as exc:
        res["untrusted"] = str(exc)

    # back: predict straight from the folder, import to a checkpoint, export that again
    res["from_hf"] = _diff(task, _logits(load_finetuned(out).model, enc), ours, valid)
    import_hf(out, back)
    res["roundtrip"] = _diff(task, _logits(load_finetuned(back).model, enc), ours, valid)
    info2 = export_hf(back, again)
    first, second = load_file(f"{out}/model.safetensors"), load_file(f"{again}/model.safetensors")
    res["reexport_equal"] = first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    res["reexport_config"] = json.loads((Path(again) / "config.json").read_text())
    res["reexport_class"] = info2["class"]
    return res


def _diff(task: str, a, b, valid) -> float:
    return (a - b).abs().max().item() if task == "re" else (a - b)[valid].abs().max().item()


# the default suite keeps NER; QA and RE (the same remote-code module, other head outputs) are extended
@pytest.mark.parametrize("task", ["ner", pytest.param("qa", marks=pytest.mark.extended),
                                  pytest.param("re", marks=pytest.mark.extended)])
def test_mlp_head_exports_with_remote_code(tmp_path, monkeypatch, task):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    layout, world, head = CASES[task]
    run_world(world, finetune_rank, task, QUICK + layout + head + [f"exp_manager.exp_dir={tmp_path}",
                                                                   "exp_manager.name=run"])
    (res,) = run_world(1, _check, task, str(tmp_path / "run" / "checkpoints"), str(tmp_path / "hf"),
                       str(tmp_path / "back"), str(tmp_path / "again"))
    cls = {"ner": "BioMegatronForTokenClassification", "qa": "BioMegatronForQuestionAnswering",
           "re": "BioMegatronForSequenceClassification"}[task]
    cfg = res["config"]
    assert res["info"]["class"] == cls and res["info"]["remote_code"] and res["hf_class"] == cls
    assert cfg["architectures"] == [cls] and cfg["model_type"] == "bio-megatron-bert"
    assert cfg["auto_map"] == {"AutoConfig": "modeling_bio_megatron.BioMegatronConfig",
                               AUTO[task]: f"modeling_bio_megatron.{cls}"}
    assert res["same_code"] and set(res["imports"]) <= {"__future__", "torch", "transformers"}
    settings = dict(h.split("=") for h in head)
    assert cfg["bio_megatron_head"]["fc_hidden_size"] == int(settings["model.fc_hidden_size"])
    assert res["scale"] > 0.3 and res["diff"] < 1e-4, res
    assert res["loss_diff"] < 1e-4, res
    assert res["from_hf"] < 1e-4 and res["roundtrip"] < 1e-4, res
    assert res["reexport_equal"] and res["reexport_class"] == cls
    assert res["reexport_config"]["bio_megatron_head"] == cfg["bio_megatron_head"]
    assert "trust_remote_code=True" in res["untrusted"], res["untrusted"]
    if task == "qa":
        (preds, nbest), (preds_hf, nbest_hf) = res["qa_ckpt"], res["qa_hf"]
        assert preds == preds_hf and sorted(preds) == ["a", "b"] and all(preds.values())
        for k in nbest:
            assert [n["text"] for n in nbest[k]] == [n["text"] for n in nbest_hf[k]]
            assert max(abs(a["probability"] - b["probability"]) for a, b in zip(nbest[k], nbest_hf[k])) < 1e-5
    else:
        assert len(res["pipeline"]) >= (10 if task == "ner" else 1)
        for (label, score), (exp_label, exp_score) in zip(res["pipeline"], res["expected"]):
            assert label == exp_label and abs(score - exp_score) < 1e-4, res
        if task == "ner":
            assert cfg["id2label"] == {"0": "O", "1": "B-Chemical", "2": "I-Chemical"}


def _hf_folder(path, **config) -> str:
    path.mkdir()
    base = {"model_type": "bio-megatron-bert", "architectures": ["BioMegatronForTokenClassification"],
            "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 256,
            "max_position_embeddings": 128, "type_vocab_size": 2}
    (path / "config.json").write_text(json.dumps({**base, **config}))
    return str(path)


def test_bad_remote_code_folders_are_named(tmp_path):
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.utils.errors import CheckpointError

    with pytest.raises(CheckpointError, match="needs bio_megatron_head"):
        resolve_source(_hf_folder(tmp_path / "none"))
    bad = {"num_fc_layers": 0, "fc_hidden_size": 32, "activation": "swish", "fc_dropout": 0.1}
    with pytest.raises(CheckpointError, match=r"num_fc_layers \(0\).*activation \('swish'\)"):
        resolve_source(_hf_folder(tmp_path / "bad", bio_megatron_head=bad))
    with pytest.raises(CheckpointError, match="missing fc_dropout"):
        resolve_source(_hf_folder(tmp_path / "short", bio_megatron_head={"num_fc_layers": 2, "fc_hidden_size": None,
                                                                          "activation": "relu"}))
    with pytest.raises(CheckpointError, match="architectures"):
        resolve_source(_hf_folder(tmp_path / "arch", architectures=["BioMegatronForMaskedLM"]))
    good = {"num_fc_layers": 2, "fc_hidden_size": 32, "activation": "gelu", "fc_dropout": 0.2}
    src = resolve_source(_hf_folder(tmp_path / "good", bio_megatron_head=good))
    assert src.task == "ner"
    assert src.head == {"head": {"num_fc_layers": 2, "activation": "gelu", "fc_dropout": 0.2}, "fc_hidden_size": 32}


def _export(ckpt: str, out: str) -> dict:
    from bio_megatron.formats.hf.convert import export_hf

    return export_hf(ckpt, out)


def test_finetune_from_remote_code_folder_equals_from_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    over = ["trainer.max_steps=2", "trainer.val_check_interval=2", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path}"]
    run_world(1, finetune_rank, "ner", over + CASES["ner"][2] + ["exp_manager.name=src"])
    run_world(1, _export, str(tmp_path / "src" / "checkpoints"), str(tmp_path / "hf"))
    # run names other than "hf": a run folder at exp_dir/hf would be the exported folder itself (refused)
    runs = {name: run_world(1, finetune_rank, "ner", over + [f"model.restore_from_path={path}",
                                                             f"exp_manager.name=from_{name}"])[0]["losses"]
            for name, path in (("ckpt", tmp_path / "src" / "checkpoints"), ("hf", tmp_path / "hf"))}
    assert max(abs(a - b) for a, b in zip(runs["ckpt"], runs["hf"])) < 1e-6, runs
    # A folder whose stated head does not fit its weights is named, not a raw shape error.
    bad = tmp_path / "hf-bad"
    shutil.copytree(tmp_path / "hf", bad)
    config = json.loads((bad / "config.json").read_text())
    config["bio_megatron_head"]["fc_hidden_size"] += 8
    (bad / "config.json").write_text(json.dumps(config))
    message = run_world(1, _import_error, str(bad), str(tmp_path / "imported-bad"))[0]
    assert "has shape" in message and "in this model" in message, message
    assert not (tmp_path / "imported-bad").exists()


def _import_error(hf_dir: str, out: str) -> str:
    from bio_megatron.formats.hf.convert import import_hf
    from bio_megatron.utils.errors import CheckpointError

    try:
        import_hf(hf_dir, out)
    except CheckpointError as exc:
        return str(exc)
    return "no error"
