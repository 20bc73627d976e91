"""``import hf``, hardened: folders as transformers 5 writes them (``tokenizer.json`` only, no ``vocab.txt``)
import with their vocabulary and lower-casing; what the engine cannot compute exactly (a ReLU MegatronBert, a
BPE tokenizer) is refused in one line with exit 2; ``--verify`` runs transformers' own model loaded from the
folder against the imported checkpoint (exit 0 and the figure; exit 1 when the checkpoint is not the folder's).

The folders are random tiny ``MegatronBertForPreTraining`` models saved with ``save_pretrained`` (no download,
no training), every bias and LayerNorm perturbed so that no misplaced weight hides behind 0s and 1s.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from harness import cli_forked, run_world

ROOT = Path(__file__).resolve().parents[2]
VOCAB_FILE = ROOT / "bio_megatron" / "resources" / "vocab" / "bert_base_uncased_vocab.txt"


def _make_folder(folder: Path, seed: int, **config) -> list[str]:
    import torch
    from transformers import BertTokenizer, MegatronBertConfig, MegatronBertForPreTraining

    tokens = VOCAB_FILE.read_text(encoding="utf-8").splitlines()
    torch.manual_seed(seed)
    cfg = MegatronBertConfig(vocab_size=len(tokens), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=32, layer_norm_eps=1e-5,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2,
                             **config)
    model = MegatronBertForPreTraining(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layernorm" in name or name.endswith("bias") or ".ln." in name:
                p.add_(torch.randn(p.shape) * 0.1)
    model.save_pretrained(folder)
    BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True).save_pretrained(str(folder))
    (folder / "vocab.txt").unlink(missing_ok=True)  # transformers 4 would write one; 5 does not
    return tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hf_hardened")
    tokens = _make_folder(root / "hf", seed=0)
    _make_folder(root / "other", seed=1)
    return {"root": root, "hf": root / "hf", "other": root / "other", "tokens": tokens}


def _cli_child(argv: list[str]) -> tuple[int, str, str]:
    import logging

    from bio_megatron.cli import main
    from bio_megatron.utils.log import setup_logging

    setup_logging()
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    logging.getLogger("bio_megatron").addHandler(handler)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue(), logged.getvalue()


def _cli(*argv: str) -> tuple[int, dict | None, str]:
    """The CLI in a forked 1-rank world (fast: no new interpreter; and the distributed state it sets up stays out of
    the pytest process, whose later forks must not inherit it): exit code, JSON result, what it logged."""
    ((code, text, log),) = run_world(1, _cli_child, list(argv))
    return code, (json.loads(text) if text.strip() else None), log


def _refused(folder: Path, out: Path) -> str:
    """``bio-megatron import hf`` as a user runs it: exit 2, one line on stderr, nothing written."""
    r = cli_forked(["import", "hf", "--model", str(folder), "--out", str(out)])
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()
    return r.stderr


def test_tokenizer_json_only_folder_imports_and_verifies(folders, tmp_path):
    import yaml

    assert not (folders["hf"] / "vocab.txt").exists() and (folders["hf"] / "tokenizer.json").exists()
    code, result, _ = _cli("import", "hf", "--model", str(folders["hf"]), "--out", str(tmp_path / "ckpt"), "--verify")
    report = result["verify"]
    print(f"import hf --verify (tokenizer.json only): max |logit diff| {report['max_abs_diff']:.3g} "
          f"{report['outputs']}")
    assert code == 0 and report["verified"] and set(report["outputs"]) == {"mlm", "nsp"}
    assert report["max_abs_diff"] < 1e-4 and report["batch"]["lengths"] == [24, 16, 8]
    assert "from_pretrained" in report["reference"]
    ckpt = Path(result["out"])
    saved = next(ckpt.rglob("vocab.txt"))
    assert saved.read_text(encoding="utf-8").splitlines() == folders["tokens"]
    cfg = yaml.safe_load(next(ckpt.rglob("config.yaml")).read_text())
    assert cfg["model"]["tokenizer"]["do_lower_case"] is True  # from the normalizer, not guessed


def _verify_against_other(other: str, hf: str, tmp: str) -> dict:
    from bio_megatron.formats.hf.convert import import_hf, verify_hf_import

    import_hf(Path(other), Path(tmp) / "other_ckpt")  # same shape and vocabulary, other weights
    return verify_hf_import(Path(hf), Path(tmp) / "other_ckpt")


def test_verify_catches_a_checkpoint_that_is_not_the_folders(folders, tmp_path):
    (report,) = run_world(1, _verify_against_other, str(folders["other"]), str(folders["hf"]), str(tmp_path))
    print(f"import hf --verify against another checkpoint: max |logit diff| {report['max_abs_diff']:.3g}")
    assert not report["verified"] and report["max_abs_diff"] > 0.1
    # and the CLI exits 1 above the tolerance
    code, result, _ = _cli("import", "hf", "--model", str(folders["hf"]), "--out", str(tmp_path / "strict"),
                           "--verify", "--tolerance", "1e-12")
    assert code == 1 and result["verify"]["verified"] is False


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
    ({"position_embedding_type": "relative_key_query"}, "position_embedding_type 'relative_key_query'"),
])
def test_megatron_bert_configs_it_cannot_reproduce_exit_2(folders, tmp_path, change, message):
    folder = tmp_path / "hf"
    shutil.copytree(folders["hf"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    assert message in _refused(folder, tmp_path / "ckpt")


def test_relu_megatron_bert_would_otherwise_be_wrong(folders, tmp_path):
    """Why the refusal: the same weights under ReLU give logits far from GELU's (what a silent import gave)."""
    import torch
    from transformers import MegatronBertForPreTraining

    gelu = MegatronBertForPreTraining.from_pretrained(str(folders["hf"])).eval()
    relu = MegatronBertForPreTraining.from_pretrained(str(folders["hf"]), hidden_act="relu").eval()
    ids = torch.randint(5, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (gelu(ids).prediction_logits - relu(ids).prediction_logits).abs().max().item()
    assert diff > 0.1, diff


def test_tokenizers_it_cannot_reproduce_exit_2(folders, tmp_path):
    for name, edit, message in (
            ("bpe", lambda t: {**t, "model": {**t["model"], "type": "BPE"}}, "tokenizer model 'BPE'"),
            ("accents", lambda t: {**t, "normalizer": {**t["normalizer"], "strip_accents": False}},
             "strip_accents False"),
            ("small", lambda t: {**t, "model": {**t["model"], "vocab": {**t["model"]["vocab"], "[extra]": 30522}}},
             "vocab_size is 30522")):
        folder = tmp_path / name
        shutil.copytree(folders["hf"], folder)
        tok = json.loads((folder / "tokenizer.json").read_text())
        (folder / "tokenizer.json").write_text(json.dumps(edit(tok)))
        code, _, log = _cli("import", "hf", "--model", str(folder), "--out", str(tmp_path / f"{name}_ckpt"))
        assert code == 2 and message in log, (name, log)
