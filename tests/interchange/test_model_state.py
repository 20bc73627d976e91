"""``formats/state.ModelState``, the one value every format is read into and written from, and
``formats/ours.read_ours``, the one reader of our checkpoints into it.

The TP2xPP2 pretraining checkpoint (NSP head) goes out through each format's real ``export`` command and back in
through its ``import`` command; both checkpoints, read with ``read_ours``, hold the same tensors bit for bit, the
same shape, family and vocabulary, and ``formats/detect.detect`` names each written folder or file's format. A
fine-tuned NER checkpoint reads with its head, labels and settings.
"""

from __future__ import annotations

from pathlib import Path

import torch
from harness import run_world

# (export argv, import argv) per format; ``{ckpt}``, ``{mid}``, ``{back}`` filled in per run.
ROUND_TRIPS = {
    "hf": (["export", "hf", "--checkpoint", "{ckpt}", "--out", "{mid}"],
           ["import", "hf", "--model", "{mid}", "--out", "{back}"]),
    "megatron-lm": (["export", "megatron-lm", "--checkpoint", "{ckpt}", "--out", "{mid}", "--tp", "2"],
                    ["import", "megatron-lm", "--checkpoint", "{mid}", "--out", "{back}"]),
    "nemo": (["export", "nemo", "--checkpoint", "{ckpt}", "--out", "{mid}.nemo", "--tp", "2", "--pp", "2"],
             ["import", "nemo", "--model", "{mid}.nemo", "--out", "{back}"]),
}


def _summary(state) -> dict:
    shape = {k: v for k, v in state.shape.__dict__.items() if k != "status"}  # "test" (tiny) or "custom"
    m = state.model
    return {"family": state.family, "task": state.task, "vocab_size": state.vocab_size, "binary": state.binary_head,
            "shape": shape, "positions": m.max_position_embeddings, "eps": m.layernorm_epsilon,
            "block": m.transformer_block_type, "lower": state.lowercase, "vocab": state.vocab_text}


def _round_trips(ckpt: str, root: str) -> dict:
    from bio_megatron.cli import main
    from bio_megatron.formats.detect import detect
    from bio_megatron.formats.ours import read_ours

    first = read_ours(ckpt)
    out = {"first": _summary(first), "keys": sorted(first.tensors), "trips": {}}
    for name, (export, import_) in ROUND_TRIPS.items():
        fill = {"ckpt": ckpt, "mid": f"{root}/{name}_mid", "back": f"{root}/{name}_back"}
        rcs = [main([a.format(**fill) for a in argv]) for argv in (export, import_)]
        back = read_ours(fill["back"])
        out["trips"][name] = {
            "rcs": rcs, "summary": _summary(back), "keys": sorted(back.tensors),
            "detected": [detect(fill["mid"] + (".nemo" if name == "nemo" else "")), detect(fill["back"])],
            "not_equal": [k for k, v in first.tensors.items()
                          if not torch.equal(v, back.tensors.get(k, torch.empty(0)))]}
    return out


def test_ours_to_every_format_and_back_holds_equal_tensors(ours, tmp_path):
    (res,) = run_world(1, _round_trips, str(ours), str(tmp_path))
    first = res["first"]
    assert first["family"] == "megatron_bert" and first["binary"] and first["task"] is None
    assert "embedding.word_embeddings.weight" in res["keys"] and "binary_head.weight" in res["keys"]
    for name, trip in res["trips"].items():
        assert trip["rcs"] == [0, 0], name
        assert trip["detected"] == [name, "ours"]  # what each export wrote is that format to formats/detect
        assert trip["keys"] == res["keys"], (name, set(trip["keys"]) ^ set(res["keys"]))
        assert trip["not_equal"] == [], (name, trip["not_equal"])
        assert trip["summary"] == first, name


def _read_ner(ckpt: str) -> dict:
    from bio_megatron.formats.ours import read_ours

    state = read_ours(ckpt)
    return {"task": state.task, "labels": state.labels, "head": sorted(state.head),
            "settings": state.head_settings, "encoder_has_head": any(k.startswith("head.") for k in state.tensors),
            "rows": state.tensors["embedding.word_embeddings.weight"].shape[0], "vocab_size": state.vocab_size}


def test_a_finetuned_checkpoint_reads_with_its_head_and_labels(tmp_path):
    from finetune.ft_runs import finetune_rank

    run_world(1, finetune_rank, "ner", ["trainer.max_steps=2", "model.dataset.max_eval_examples=8",
                                        "model.dataset.test_file=null", "trainer.val_check_interval=2",
                                        "model.head.num_fc_layers=2", f"exp_manager.exp_dir={tmp_path}",
                                        "exp_manager.name=ner"])
    (res,) = run_world(1, _read_ner, str(tmp_path / "ner" / "checkpoints"))
    assert res["task"] == "ner" and res["labels"] == ["O", "B-Chemical", "I-Chemical"]
    assert res["head"] and all(k.startswith("head.") for k in res["head"]) and not res["encoder_has_head"]
    assert res["settings"]["num_fc_layers"] == 2 and "activation" in res["settings"]
    assert res["rows"] == res["vocab_size"]  # the padding is each writer's business


def test_a_hugging_face_folder_is_not_read_as_ours(tmp_path):
    import pytest

    from bio_megatron.formats.ours import read_ours
    from bio_megatron.utils.errors import CheckpointError

    (tmp_path / "config.json").write_text('{"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 8, '
                                          '"num_attention_heads": 2, "intermediate_size": 8, '
                                          '"max_position_embeddings": 8, "type_vocab_size": 2}')
    with pytest.raises(CheckpointError, match="not a checkpoint of ours"):
        read_ours(Path(tmp_path))


def _rewrite(ckpt: str, root: str) -> dict:
    import json

    from bio_megatron.formats.ours import read_ours, write_ours

    first = read_ours(ckpt)
    first.origin = {"test_origin": {"from": "test_model_state"}}
    seen: dict = {}

    def check(tmp, tensors) -> dict:
        seen["keys"] = sorted(tensors)
        return {"verified": True}

    written = write_ours(first, f"{root}/rewritten", "import test", verify=check)
    back = read_ours(f"{root}/rewritten")
    meta = json.loads(Path(f"{root}/rewritten/bio_megatron.json").read_text())
    refused = write_ours(first, f"{root}/refused", "import test",
                         verify=lambda tmp, tensors: {"verified": False, "max_abs_diff": 1.0, "tolerance": 1e-4,
                                                      "reference": "a refusing check"})
    return {"first": _summary(first), "back": _summary(back), "keys": [sorted(first.tensors), sorted(back.tensors)],
            "not_equal": [k for k, v in first.tensors.items()
                          if not torch.equal(v, back.tensors.get(k, torch.empty(0)))],
            "seen": seen.get("keys"), "written": written, "meta": meta, "refused": refused,
            "refused_exists": Path(f"{root}/refused").exists()}


def test_write_ours_is_the_inverse_of_read_ours(ours, tmp_path):
    """``write_ours`` (the one writer every importer saves through) of ``read_ours``'s state: the same tensors bit for
    bit, shape, family and vocabulary; the state's ``source`` and ``origin`` in ``bio_megatron.json``; a failing
    ``verify`` (given the full tensors the model was filled with) leaves nothing at ``out``."""
    (res,) = run_world(1, _rewrite, str(ours), str(tmp_path))
    assert res["keys"][0] == res["keys"][1] and res["not_equal"] == [], res["not_equal"]
    assert res["back"] == res["first"]
    assert res["seen"] == res["keys"][0]
    assert res["written"]["checkpoint"] == str(tmp_path / "rewritten")
    meta = res["meta"]
    assert meta["imported_from"].startswith(str(ours)) and meta["test_origin"] == {"from": "test_model_state"}
    assert meta["family"] == "megatron_bert" and meta["task"] is None and meta["layout"]["tp"] == 1
    assert res["refused"]["checkpoint"] is None and not res["refused_exists"]
