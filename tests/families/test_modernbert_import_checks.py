"""What ``import hf`` checks and keeps of a ModernBERT folder beyond its weights: a ``tokenizer.json`` with more tokens
than config.json's ``vocab_size`` is refused by name (file and both numbers), exit 2, nothing written; ``data
tokenize`` records a ``tokenizer.json`` vocabulary as the BPE it is (not WordPiece); HF's ``classifier_dropout`` of a
task class is read at import and written back by ``export hf`` (the round trip keeps config.json's value);
``model.classifier_head.pooling: mean`` (ModernBERT's ``classifier_pooling``) is refused for another family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from architectures.hf_parity import import_hf_folder
from harness import run_world
from reliability.cli_log import run_cli
from reliability.files import tree_digest

from families.test_modernbert_heads import _make_task_folder
from families.test_modernbert_tokenizer import _make_mlm

DROPOUT = 0.25  # not transformers' default (0.0) nor our heads' (0.1 / 0.0)


def _make_oversized_tokenizer(folder: str) -> dict:
    """A random ModernBertForMaskedLM whose tokenizer.json then gains three tokens config.json does not count."""
    from tokenizers import Tokenizer

    ref = _make_mlm(folder)
    tok = Tokenizer.from_file(f"{folder}/tokenizer.json")
    tok.add_tokens(["zzextra1", "zzextra2", "zzextra3"])
    tok.save(f"{folder}/tokenizer.json")
    return {"config": ref["vocab"], "tokens": tok.get_vocab_size(with_added_tokens=True)}


def _import_cli(hf_dir: str, out: str) -> tuple[int, str]:
    """``import hf`` and its error lines, in a forked child (an import that went ahead joins a process group)."""
    return run_cli(["import", "hf", "--model", hf_dir, "--out", out], sep="\n")


def test_a_tokenizer_json_larger_than_vocab_size_is_refused_by_name(tmp_path):
    """Token ids past the embedding would read rows the model does not have: import hf exits 2 with one line naming
    the tokenizer.json, its token count and config.json's vocab_size; nothing at --out, the folder unchanged."""
    (sizes,) = run_world(1, _make_oversized_tokenizer, str(tmp_path / "hf"))
    assert sizes["tokens"] == sizes["config"] + 3, sizes
    before = tree_digest(tmp_path / "hf")
    (rc, text), = run_world(1, _import_cli, str(tmp_path / "hf"), str(tmp_path / "out"))
    assert rc == 2 and len(text.splitlines()) == 1, text
    assert "tokenizer.json" in text and "vocab_size" in text, text
    assert str(sizes["tokens"]) in text and str(sizes["config"]) in text, text
    assert not (tmp_path / "out").exists() and tree_digest(tmp_path / "hf") == before


def _tokenize(tokenizer_json: str, jsonl: str, prefix: str) -> int:
    from bio_megatron.cli import main

    return main(["data", "tokenize", "--input", jsonl, "--vocab", tokenizer_json, "--output-prefix", prefix])


def test_data_tokenize_records_a_tokenizer_json_as_bpe(tmp_path):
    """The record beside the tokenized data names the tokenizer.json, its kind ``bpe`` and the file's sha256."""
    import hashlib

    from families.test_modernbert_tokenizer import TEXTS, write_tokenizer_json

    write_tokenizer_json(str(tmp_path / "tokenizer.json"))
    jsonl = tmp_path / "docs.jsonl"
    docs = [{"id": str(i), "source": "pubmed", "sentences": TEXTS} for i in range(3)]
    jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (rc,) = run_world(1, _tokenize, str(tmp_path / "tokenizer.json"), str(jsonl), str(tmp_path / "data" / "docs"))
    assert rc == 0
    vocab = json.loads((tmp_path / "data" / "docs.bio_megatron.json").read_text())["vocab"]
    assert vocab["kind"] == "bpe" and Path(vocab["path"]).name == "tokenizer.json", vocab
    assert vocab["sha256"] == hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest(), vocab


def _import_and_export(hf_dir: str, ckpt: str, out: str) -> dict:
    from bio_megatron.formats.hf.convert import export_hf

    info = import_hf_folder(hf_dir, ckpt)
    export_hf(ckpt, out)
    return {"import": info, "config": json.loads(Path(out, "config.json").read_text())}


def _make_dropout_folder(folder: str, task: str) -> dict:
    return _make_task_folder(folder, task, classifier_dropout=DROPOUT)


@pytest.mark.parametrize("task", ["ner", "re"])
def test_classifier_dropout_survives_import_and_export(tmp_path, task):
    """A ModernBertFor{Token,Sequence}Classification with classifier_dropout 0.25: import hf (--verify) then export
    hf gives config.json the same classifier_dropout (the head's dropout in between)."""
    run_world(1, _make_dropout_folder, str(tmp_path / "hf"), task)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["classifier_dropout"] == DROPOUT
    (res,) = run_world(1, _import_and_export, str(tmp_path / "hf"), str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert res["import"]["rc"] == 0 and res["import"]["verify"]["verified"], res["import"]
    assert res["config"]["classifier_dropout"] == DROPOUT, res["config"]


def test_mean_pooling_is_refused_for_a_family_whose_heads_read_cls(tmp_path):
    """model.classifier_head.pooling=mean with model.family albert (its sequence head reads [CLS]): finetune classify
    is one config problem naming the key, the value and the family, exit 2, no run folder."""
    exp = tmp_path / "runs"
    (rc, text), = run_world(1, run_cli, [
        "finetune", "classify", "--config", "tiny_classify", "model.family=albert",
        "model.transformer_block_type=post_ln", "trainer.max_steps=1", f"exp_manager.exp_dir={exp}",
        "model.classifier_head.pooling=mean"], 40, "\n")
    problems = [ln for ln in text.splitlines() if ln.lstrip().startswith("- ")]  # the config's list of problems
    assert rc == 2 and len(problems) == 1, text
    assert "model.classifier_head.pooling (mean)" in problems[0] and "albert" in problems[0], text
    assert not exp.exists()
