"""A damaged Hugging Face folder is one clear line and exit 2, for every command that reads one.

Found on main before issue 11: a truncated ``model.safetensors`` or a broken ``config.json`` given to
``import hf`` (or to ``finetune``/``predict`` from an HF folder) ended in a safetensors/JSON traceback.
Each case damages a real folder written by transformers, runs the CLI, and checks the exit code, that the
message names the file (and line or key) and what was expected, and that no output was left behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from reliability.files import tree_digest
from reliability.test_outputs import WORDS, _siblings, make_hf_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good_hf(tmp_path_factory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("hfin") / "hf")


@pytest.fixture(scope="module")
def good_ner_hf(tmp_path_factory) -> Path:
    """A tiny ``MegatronBertForTokenClassification`` with a label map, as transformers saves it."""
    import torch
    from transformers import MegatronBertConfig, MegatronBertForTokenClassification

    out = tmp_path_factory.mktemp("hfner") / "hf_ner"
    torch.manual_seed(0)
    labels = ["O", "B-Chemical", "I-Chemical"]
    cfg = MegatronBertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                             id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})
    MegatronBertForTokenClassification(cfg).save_pretrained(out)
    (out / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return out


def _damaged(src: Path, dest: Path, name: str, damage) -> Path:
    shutil.copytree(src, dest)
    damage(dest / name)
    return dest


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _forked_msg(*argv: str) -> dict:
    """``main`` in a forked process with its ERROR line captured."""
    from harness import run_world

    (res,) = run_world(1, _main_with_message, list(argv))
    return res


def _main_with_message(argv: list[str]) -> dict:
    from reliability.test_outputs import _run

    os.chdir(ROOT)  # recipes name their data relative to the checkout
    try:
        rc, msg = _run(argv)
    except BaseException as exc:  # would be a traceback for the user
        return {"rc": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"rc": rc, "msg": msg}


CASES = {
    "truncated safetensors": ("model.safetensors", _truncate, ["model.safetensors", "truncated or damaged"]),
    "safetensors header only": ("model.safetensors", lambda f: f.write_bytes(f.read_bytes()[:200]),
                                ["model.safetensors", "unreadable"]),
    "broken JSON": ("config.json", lambda f: f.write_text(f.read_text()[:-40]), ["config.json:", "broken JSON"]),
    "not an object": ("config.json", lambda f: f.write_text("[1, 2]\n"), ["config.json", "JSON object"]),
    "missing key": ("config.json", lambda f: f.write_text(json.dumps(
        {k: v for k, v in json.loads(f.read_text()).items() if k != "hidden_size"})),
        ["config.json", "hidden_size missing"]),
    "mistyped key": ("config.json", lambda f: f.write_text(json.dumps(
        {**json.loads(f.read_text()), "num_hidden_layers": "2"})), ["config.json", "num_hidden_layers '2'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_hf_damaged_folder(case, good_hf, tmp_path):
    name, damage, expected = CASES[case]
    hf = _damaged(good_hf, tmp_path / "hf", name, damage)
    before = tree_digest(hf)
    out = tmp_path / "ckpt"
    res = _forked_msg("import", "hf", "--model", str(hf), "--out", str(out))
    assert res["rc"] == 2, res
    assert str(hf / name) in res["msg"] and all(e in res["msg"] for e in expected), res["msg"]
    assert "\n" not in res["msg"]
    assert not out.exists() and _siblings(out) == []
    assert tree_digest(hf) == before


def test_import_hf_truncated_pytorch_bin(good_hf, tmp_path):
    import torch
    from safetensors.torch import load_file

    hf = tmp_path / "hf"
    shutil.copytree(good_hf, hf)
    torch.save(load_file(str(hf / "model.safetensors")), hf / "pytorch_model.bin")
    (hf / "model.safetensors").unlink()
    _truncate(hf / "pytorch_model.bin")
    res = _forked_msg("import", "hf", "--model", str(hf), "--out", str(tmp_path / "ckpt"))
    assert res["rc"] == 2 and str(hf / "pytorch_model.bin") in res["msg"] and "damaged" in res["msg"], res
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("case", ["truncated safetensors", "broken JSON"])
def test_predict_from_damaged_hf_folder(case, good_ner_hf, tmp_path):
    name, damage, expected = CASES[case]
    hf = _damaged(good_ner_hf, tmp_path / "hf", name, damage)
    docs = tmp_path / "docs.txt"
    docs.write_text("the cell and the gene\n")
    out = tmp_path / "pred.jsonl"
    res = _forked_msg("predict", "ner", "--checkpoint", str(hf), "--input", str(docs), "--out", str(out))
    assert res["rc"] == 2, res
    assert str(hf / name) in res["msg"] and all(e in res["msg"] for e in expected), res["msg"]
    assert not out.exists() and _siblings(out) == []


def test_predict_from_good_hf_folder_still_works(good_ner_hf, tmp_path):
    """The checks above must not refuse a sound folder."""
    docs = tmp_path / "docs.txt"
    docs.write_text("the cell and the gene\n")
    out = tmp_path / "pred.jsonl"
    res = _forked_msg("predict", "ner", "--checkpoint", str(good_ner_hf), "--input", str(docs), "--out", str(out))
    assert res["rc"] == 0, res
    assert json.loads(out.read_text().splitlines()[0])["id"] is not None


@pytest.mark.parametrize("case", ["truncated safetensors", "missing key"])
def test_finetune_from_damaged_hf_folder(case, good_hf, tmp_path):
    name, damage, expected = CASES[case]
    hf = _damaged(good_hf, tmp_path / "hf", name, damage)
    res = _forked_msg("finetune", "ner", "--config", "nemo_configs/ner/tiny_ner.yaml",
                      f"model.restore_from_path={hf}", f"exp_manager.exp_dir={tmp_path / 'runs'}",
                      "trainer.max_steps=1", "model.dataset.max_eval_examples=4", "model.dataset.max_seq_length=64")
    assert res["rc"] == 2, res
    assert str(hf / name) in res["msg"] and all(e in res["msg"] for e in expected), res["msg"]
    finished = [p for p in (tmp_path / "runs").rglob("*") if p.name in ("results.json", "bio_megatron.json")]
    assert finished == []
