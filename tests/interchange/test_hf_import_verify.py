"""``bio-megatron import hf --verify`` through the CLI for the post-LN families, the HF config checked against the
tensors beside it, and a failed ``--verify`` that leaves nothing behind (issue 21).

Found on main before issue 21: ``import hf --verify`` of a post-LN ``BertForMaskedLM`` or a ``RobertaForMaskedLM``
folder exited 2 with "a post-LN (original BERT) model; Megatron-LM's BERT is pre-LN" (verify read the written
checkpoint back through the Megatron-LM exporter's loader); a ``config.json`` with fewer layers than its weights
imported with the extra layers silently dropped; a failed ``--verify`` (exit 1) left the checkpoint in place,
complete with its ``checksums.json``, as if it were good.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from architectures.hf_parity import perturb_norms_and_biases
from harness import run_world

from reliability.files import tree_digest
from reliability.test_outputs import WORDS, _siblings


def _cli_child(argv: list[str]) -> dict:
    """``main(argv)`` in a forked child: exit code, the ERROR line and the JSON summary printed on stdout."""
    import contextlib
    import io

    from bio_megatron.cli import main
    from reliability.cli_log import project_records

    stdout = io.StringIO()
    try:
        with project_records() as records, contextlib.redirect_stdout(stdout):
            rc = main(argv)
    except BaseException as exc:  # a traceback the real CLI would show
        return {"rc": None, "error": f"{type(exc).__name__}: {exc}"}
    text = stdout.getvalue()
    return {"rc": rc, "msg": " ".join(r.getMessage() for r in records if r.levelname == "ERROR"),
            "summary": json.loads(text[text.index("{"):]) if "{" in text else None}


def _cli(*argv: str) -> dict:
    (res,) = run_world(1, _cli_child, list(argv))
    return res


def _bert_mlm(out: Path) -> Path:
    """A random tiny post-LN ``BertForMaskedLM`` (original BERT), LayerNorms and biases moved off 1 and 0."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-7,
                     architectures=["BertForMaskedLM"])
    hf = BertForMaskedLM(cfg).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(out)
    (out / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return out


def _roberta_mlm(out: Path) -> Path:
    """A random tiny ``RobertaForMaskedLM`` with a byte-level BPE vocabulary trained here (one token type,
    positions offset by padding_idx + 1)."""
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    from bio_megatron.vocab.bpe import train_bpe

    out.mkdir(parents=True)
    text = out.parent / "bpe_train.txt"
    text.write_text("Aspirin reduces the risk of myocardial infarction in patients.\n" * 3, encoding="utf-8")
    vocab = train_bpe([text], out, size=300, min_frequency=1)["vocab_size"]
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40, type_vocab_size=1, layer_norm_eps=1e-5,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, architectures=["RobertaForMaskedLM"])
    hf = RobertaForMaskedLM(cfg).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_verify")
    return {"bert": _bert_mlm(root / "bert_mlm"), "roberta": _roberta_mlm(root / "roberta_mlm")}


@pytest.mark.parametrize("family,cls", [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")])
def test_import_hf_verify_of_post_ln_families(folders, tmp_path, family, cls):
    """The regression: both exited 2 on main. transformers' own class for the folder is the reference."""
    out = tmp_path / "ckpt"
    res = _cli("import", "hf", "--model", str(folders[family]), "--out", str(out), "--verify")
    assert res["rc"] == 0, res
    report = res["summary"]["verify"]
    assert report["verified"] and set(report["outputs"]) == {"mlm"} and report["max_abs_diff"] < 1e-4, report
    assert f"{cls}.from_pretrained" in report["reference"] and report["checkpoint"] == str(out), report
    assert (out / "checksums.json").is_file() and _siblings(out) == []
    print(f"import hf --verify {cls}: max |ours - transformers| = {report['max_abs_diff']:.2e}")


def test_failed_verify_leaves_nothing(folders, tmp_path):
    """Above tolerance (forced with --tolerance 1e-12: two implementations differ by ~1e-7 in fp32): exit 1, the
    report on stdout, nothing at --out and no hidden sibling; under --overwrite the earlier output is kept as it
    was."""
    out = tmp_path / "ckpt"
    res = _cli("import", "hf", "--model", str(folders["bert"]), "--out", str(out), "--verify", "--tolerance", "1e-12")
    report = res["summary"]["verify"]
    assert res["rc"] == 1 and not report["verified"] and report["max_abs_diff"] > 1e-12, res
    assert res["summary"]["out"] is None and report["checkpoint"] is None
    assert "not written" in res["msg"] and "--tolerance" in res["msg"], res["msg"]
    assert not out.exists() and _siblings(out) == []

    assert _cli("import", "hf", "--model", str(folders["bert"]), "--out", str(out))["rc"] == 0
    before = tree_digest(out)
    res = _cli("import", "hf", "--model", str(folders["roberta"]), "--out", str(out), "--overwrite", "--verify",
               "--tolerance", "1e-12")
    assert res["rc"] == 1 and tree_digest(out) == before and _siblings(out) == [], res


def _edit_config(src: Path, dest: Path, **changes) -> Path:
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(changes)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return dest


CASES = {  # config change -> what the one line must name (config key and value, tensor and shape)
    "fewer layers": ({"num_hidden_layers": 1}, ["num_hidden_layers 1", "2 layers", "bert.encoder.layer."]),
    "more layers": ({"num_hidden_layers": 3}, ["num_hidden_layers 3", "2 layers"]),
    "positions": ({"max_position_embeddings": 128},
                  ["max_position_embeddings 128", "bert.embeddings.position_embeddings.weight", "[64, 32]"]),
    "vocabulary": ({"vocab_size": 120}, ["vocab_size 120", "bert.embeddings.word_embeddings.weight",
                                         f"[{len(WORDS)}, 32]"]),
    "type vocabulary": ({"type_vocab_size": 3},
                        ["type_vocab_size 3", "bert.embeddings.token_type_embeddings.weight", "[2, 32]"]),
    "ffn width": ({"intermediate_size": 128},
                  ["intermediate_size 128", "bert.encoder.layer.0.intermediate.dense.weight", "[64, 32]"]),
    "hidden width": ({"hidden_size": 48, "num_attention_heads": 4},
                     ["hidden_size 48", "bert.encoder.layer.0.attention.self.query.weight", "[32, 32]"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_disagreeing_with_tensors_is_refused(folders, tmp_path, case):
    changes, expected = CASES[case]
    hf = _edit_config(folders["bert"], tmp_path / "hf", **changes)
    before = tree_digest(hf)
    out = tmp_path / "ckpt"
    res = _cli("import", "hf", "--model", str(hf), "--out", str(out))
    assert res["rc"] == 2, res
    assert "config.json disagrees with the weights" in res["msg"] and all(e in res["msg"] for e in expected), res
    assert not out.exists() and _siblings(out) == [] and tree_digest(hf) == before


def test_roberta_positions_count_the_padding_rows(folders, tmp_path):
    """RoBERTa's max_position_embeddings includes the padding_idx + 1 rows: one fewer than the table is refused."""
    hf = _edit_config(folders["roberta"], tmp_path / "hf", max_position_embeddings=39)
    res = _cli("import", "hf", "--model", str(hf), "--out", str(tmp_path / "ckpt"))
    assert res["rc"] == 2 and "max_position_embeddings 39" in res["msg"], res
    assert "roberta.embeddings.position_embeddings.weight has shape [40, 32]" in res["msg"], res
