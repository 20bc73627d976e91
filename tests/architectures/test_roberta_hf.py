"""Outside oracle for RoBERTa: a random tiny Hugging Face ``RobertaForMaskedLM`` (byte-level BPE vocabulary
trained here, positions offset by ``padding_idx + 1``, one token type) imported with ``import hf`` gives
transformers' MLM logits at TP1 and, resharded by dist-checkpointing, at TP2xPP2 (right-padded batch, real
positions compared); ``export hf`` writes a ``RobertaForMaskedLM`` folder transformers loads with the same
logits. Fine-tuning from it: ``test_roberta_finetune.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from architectures.hf_parity import (imported as import_fixture, masked_max_diff, padded_batch,
                                     perturb_norms_and_biases, pipeline_logits)
from harness import run_world

SEQ = 24
EPS = 1e-5  # RoBERTa's, not BERT's 1e-12: shows layer_norm_eps is carried over
PAD = 1


def _make_hf(folder: str) -> dict:
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    from bio_megatron.vocab.bpe import train_bpe

    out = Path(folder)
    out.mkdir(parents=True)
    text = out.parent / "bpe_train.txt"
    text.write_text("Aspirin reduces the risk of myocardial infarction in patients.\n" * 3
                    + "BRCA1 mutations increase breast cancer risk.\n", encoding="utf-8")
    vocab = train_bpe([text], out, size=300, min_frequency=1)["vocab_size"]
    (out / "tokenizer.json").unlink()  # a transformers-4 style folder: vocab.json + merges.txt only
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=SEQ + 8 + PAD + 1, type_vocab_size=1,
                        layer_norm_eps=EPS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        initializer_range=0.2, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
                        architectures=["RobertaForMaskedLM"])
    hf = RobertaForMaskedLM(cfg).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(folder)
    ids, amask = _batch(vocab)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=amask).logits
    return {"vocab": vocab, "mlm": logits.numpy()}


def _batch(vocab: int):
    """Right-padded: real tokens never the pad id (HF derives positions from ``input_ids != pad``); one type."""
    ids, amask, _ = padded_batch(vocab, SEQ, (SEQ, 17, 9), low=3)
    ids[:, 0] = 0  # <s>
    return ids.masked_fill(amask == 0, PAD), amask


def _our_logits(ckpt: str, tp: int, pp: int):
    return pipeline_logits(ckpt, tp, pp, _batch, binary_head=False)


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForMaskedLM

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = AutoModelForMaskedLM.from_pretrained(out).eval()
    ids, amask = _batch(hf.config.vocab_size)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=amask).logits
    return {"class": info["class"], "hf_class": type(hf).__name__, "mlm": logits.numpy(),
            "config": json.loads((Path(out) / "config.json").read_text()),
            "files": sorted(p.name for p in Path(out).iterdir())}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_fixture(tmp_path_factory, "hf_roberta", _make_hf)


def _diff(got, ref: dict) -> float:
    return masked_max_diff(got, ref["mlm"], _batch(ref["vocab"])[1].bool().numpy())


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)], ids=["tp1", "tp2pp2"])
def test_imported_roberta_logits_equal_transformers(imported, tp, pp):
    root, ref = imported
    res = [r for r in run_world(tp * pp, _our_logits, str(root / "ckpt"), tp, pp) if r is not None]
    assert len(res) == 1
    shape = res[0]["shape"]
    assert shape["transformer_block_type"] == "post_ln" and shape["num_tokentypes"] == 1
    assert shape["max_position_embeddings"] == SEQ + 8 and shape["layernorm_epsilon"] == EPS
    assert res[0]["vocab_file"] == "vocab.json"  # the checkpoint records its family through its vocabulary
    diff = _diff(res[0]["mlm"], ref)
    assert abs(ref["mlm"]).max() > 1.0
    assert diff < 1e-4, diff
    print(f"roberta import tp{tp}pp{pp}: max |ours - transformers| = {diff:.2e}")


def test_export_loads_in_transformers_with_same_logits(imported):
    root, ref = imported
    (res,) = run_world(1, _export_and_reload, str(root / "ckpt"), str(root / "export"))
    assert res["class"] == res["hf_class"] == "RobertaForMaskedLM"
    assert res["config"]["model_type"] == "roberta" and res["config"]["max_position_embeddings"] == SEQ + 8 + PAD + 1
    assert {"vocab.json", "merges.txt"} <= set(res["files"])
    diff = _diff(res["mlm"], ref)
    assert diff < 1e-4, diff
    print(f"roberta export -> transformers: max |exported - original| = {diff:.2e}")


def test_roberta_task_classes_are_refused(imported, tmp_path):
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.utils.errors import CheckpointError

    root, _ = imported
    folder = tmp_path / "tok_cls"
    folder.mkdir()
    cfg = json.loads((root / "hf" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["RobertaForTokenClassification"]}))
    with pytest.raises(CheckpointError, match="RobertaForTokenClassification"):
        resolve_source(folder)
