"""Other programs' models used directly, and ``import nemo --verify``.

A tiny NER model fine-tuned here (TP1, 4 steps) -> ``bio-megatron export nemo`` -> ``FILE.nemo``, then:

- ``import nemo --verify``: transformers' ``MegatronBertModel`` holding the archive's encoder (+ the archive's
  head tensors) vs the imported checkpoint: exit 0 and the figure; an archive whose head was changed after
  export is caught; ``--tolerance`` below the difference exits 1;
- ``predict ner --checkpoint FILE.nemo`` gives the fine-tuned checkpoint's logits (diff 0.0) and entities;
- ``finetune ner model.restore_from_path=FILE.nemo`` continues from the archive's weights (step-1 loss equal to
  continuing from the checkpoint itself);
- a Megatron-LM checkpoint directory is a source too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
import torch
from finetune.ft_runs import finetune_rank
from harness import cli_forked, run_world

TEXT = "Naloxone reverses the antihypertensive effect of clonidine in rats."
_FT = ["trainer.max_steps=4", "model.dataset.max_eval_examples=8", "model.dataset.test_file=null",
       "trainer.val_check_interval=4", "model.head.num_fc_layers=2"]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sources")
    run_world(1, finetune_rank, "ner", _FT + [f"exp_manager.exp_dir={root}", "exp_manager.name=ner"])
    ckpt = root / "ner" / "checkpoints"
    nemo = root / "ner.nemo"
    r = cli_forked(["export", "nemo", "--checkpoint", str(ckpt), "--out", str(nemo)])
    assert r.returncode == 0, r.stderr[-2000:]
    return {"root": root, "ckpt": ckpt, "nemo": nemo}


def _import_verify(nemo: str, out: str, tolerance: float) -> dict:
    from bio_megatron.cli.convert import run_import_nemo
    from bio_megatron.formats.nemo.convert import read_nemo
    from bio_megatron.formats.nemo.verify import verify_nemo_import

    buf = io.StringIO()
    ns = argparse.Namespace(model=nemo, out=out, num_attention_heads=None, overwrite=False, verify=True,
                            tolerance=tolerance)
    with contextlib.redirect_stdout(buf):
        code = run_import_nemo(ns)
    result = json.loads(buf.getvalue())
    with tempfile.TemporaryDirectory() as scratch:  # read_nemo writes the archive's vocabulary there
        state = read_nemo(nemo, Path(scratch))
        last = max(k for k in state.head if k.endswith(".bias"))
        state.head[last] = state.head[last] + 0.5  # the archive "changed after export": the label scores move
        damaged = verify_nemo_import(state, out)
    buf = io.StringIO()
    ns.out, ns.tolerance = out + "_strict", 1e-12
    with contextlib.redirect_stdout(buf):
        strict = run_import_nemo(ns)
    return {"code": code, "result": result, "damaged": damaged, "strict_code": strict}


def test_import_nemo_verify(archive):
    (res,) = run_world(1, _import_verify, str(archive["nemo"]), str(archive["root"] / "imported"), 1e-4)
    report = res["result"]["verify"]
    print(f"import nemo --verify (NER): max |diff| {report['max_abs_diff']:.3g} {report['outputs']}; "
          f"head changed after export: {res['damaged']['max_abs_diff']:.3g}")
    assert res["code"] == 0 and report["verified"] and set(report["outputs"]) == {"hidden", "logits"}
    assert report["max_abs_diff"] < 1e-4
    assert not res["damaged"]["verified"] and res["damaged"]["outputs"]["logits"] > 0.4
    assert res["damaged"]["outputs"]["hidden"] == report["outputs"]["hidden"]  # the encoder still agrees
    assert res["strict_code"] == 1
    # above tolerance nothing is written (issue 21: the checkpoint used to be left there, looking finished)
    strict = archive["root"] / "imported_strict"
    assert not strict.exists() and not [p for p in strict.parent.iterdir() if p.name.startswith(".imported_strict.")]


def _predict_from(nemo: str, ckpt: str) -> dict:
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.predict.ner import predict_entities

    single_process()
    a, b = load_finetuned(ckpt), load_finetuned(nemo)
    ids = torch.randint(5, a.tokenizer.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        la, lb = a.model(ids, mask, torch.zeros_like(ids)), b.model(ids, mask, torch.zeros_like(ids))
    return {"diff": (la - lb).abs().max().item(), "labels": (a.labels, b.labels), "origin": str(b.source.origin),
            "entities": (predict_entities(a, TEXT), predict_entities(b, TEXT))}


def test_predict_reads_a_nemo_archive(archive, tmp_path):
    (res,) = run_world(1, _predict_from, str(archive["nemo"]), str(archive["ckpt"]))
    assert res["diff"] == 0.0 and res["labels"][0] == res["labels"][1] and res["origin"] == str(archive["nemo"])
    assert res["entities"][0] == res["entities"][1]
    (tmp_path / "doc.txt").write_text(TEXT + "\n")
    r = cli_forked(["predict", "ner", "--checkpoint", str(archive["nemo"]), "--input", str(tmp_path / "doc.txt")])
    assert r.returncode == 0, r.stderr
    assert "entities" in json.loads(r.stdout.splitlines()[0])


def test_finetune_restores_from_a_nemo_archive(archive):
    root = archive["root"]
    common = ["trainer.max_steps=1", "model.dataset.max_eval_examples=4", "model.dataset.test_file=null",
              "trainer.val_check_interval=1", f"exp_manager.exp_dir={root}"]
    (a,) = run_world(1, finetune_rank, "ner", common + [f"model.restore_from_path={archive['nemo']}",
                                                        "exp_manager.name=from_nemo"])
    (b,) = run_world(1, finetune_rank, "ner", common + [f"model.restore_from_path={archive['ckpt']}",
                                                        "exp_manager.name=from_ckpt"])
    print(f"finetune from .nemo / from the checkpoint: step-1 loss {a['losses'][0]:.6f} / {b['losses'][0]:.6f}")
    assert a["losses"][0] == pytest.approx(b["losses"][0], abs=1e-6)


def _megatron_lm_source(root: str) -> dict:
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.vocab.builtin import resolve_vocab
    from bio_megatron.formats.megatron_lm.convert import TRACKER, _megatron_args
    from bio_megatron.formats.megatron_lm.state import mcore_to_legacy_shards
    from bio_megatron.models.bert import build_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    single_process()
    tok = WordPieceTokenizer(resolve_vocab("bert_base_cased"), False)
    m = ModelConfig(size="tiny", max_position_embeddings=128, encoder_seq_length=128, transformer_impl="local")
    model = build_model(m, tok.vocab_size, torch.float32, pre_process=True, post_process=True)
    init_weights(model, 3, 0.02, m.shape().num_layers)
    full = {k: t for k, t in model.state_dict().items() if torch.is_tensor(t) and not k.endswith("_extra_state")}
    mlm = Path(root) / "mlm"
    shard = mlm / "release" / "mp_rank_00" / "model_optim_rng.pt"
    shard.parent.mkdir(parents=True)
    padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 1)
    torch.save({"model": mcore_to_legacy_shards(full, 1)[0], "args": _megatron_args(m, tok, 1, padded, 0),
                "checkpoint_version": 3.0, "iteration": 0}, shard)
    (mlm / TRACKER).write_text("release")
    (mlm / "vocab.txt").write_text(Path(tok.vocab_file).read_text())
    src = resolve_source(mlm)
    return {"kind": src.kind, "origin": str(src.origin), "hidden": src.shape["hidden_size"], "task": src.task}


def test_megatron_lm_directory_is_a_source(tmp_path):
    (res,) = run_world(1, _megatron_lm_source, str(tmp_path))
    assert res == {"kind": "checkpoint", "origin": str(tmp_path / "mlm"), "hidden": 64, "task": None}
    (r,) = run_world(1, finetune_rank, "ner", ["trainer.max_steps=1", "model.dataset.max_eval_examples=4",
                                               "model.dataset.test_file=null", "trainer.val_check_interval=1",
                                               f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=from_mlm",
                                               f"model.restore_from_path={tmp_path / 'mlm'}"])
    assert len(r["losses"]) == 1 and r["losses"][0] > 0
