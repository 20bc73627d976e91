"""Outside oracle for ModernBERT: a random tiny Hugging Face ``ModernBertForMaskedLM`` (4 layers, local attention
with an 8-token window on layers 1 and 2, global on 0 and 3, two RoPE bases, GeGLU, bias-free, LayerNorm eps 1e-6
to show it is carried) imported with ``bio-megatron import hf --verify`` gives transformers' MLM logits (eager
attention) on a padded batch at TP1 and, resharded by dist-checkpointing, at TP2; ``export hf`` writes a folder
transformers loads as ModernBertForMaskedLM with the same logits; fine-tuning's encoder (``TaskModel`` through
``Family.task_encoder``) gives ModernBertModel's hidden states; the local window and RoPE's relative-position
property hold; an HF option the engine cannot compute is refused in one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil

import pytest
from architectures.hf_parity import (VOCAB_FILE, imported, masked_max_diff, padded_batch, perturb_norms_and_biases,
                                     vocab_lines)
from harness import run_world
from layouts import encoder_hidden, import_refusal, our_logits

SEQ, H, LAYERS = 32, 64, 4


def _config(**extra):
    from transformers import ModernBertConfig

    fields = dict(vocab_size=vocab_lines(), hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
                  intermediate_size=96, max_position_embeddings=64, norm_eps=1e-6, local_attention=8,
                  global_attn_every_n_layers=3, global_rope_theta=1000.0, local_rope_theta=50.0,
                  initializer_range=0.2, pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101,
                  eos_token_id=102, attn_implementation="eager")
    return ModernBertConfig(**{**fields, **extra})


def _batch(vocab: int):
    ids, amask, _ = padded_batch(vocab, SEQ, (SEQ, 21, 9))
    return ids * amask, amask


def _make_mlm(folder: str) -> dict:
    """The random HF ModernBertForMaskedLM folder and transformers' logits and hidden states on the batch."""
    import torch
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(0)
    hf = ModernBertForMaskedLM(_config(architectures=["ModernBertForMaskedLM"])).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(folder)
    shutil.copyfile(VOCAB_FILE, f"{folder}/vocab.txt")
    ids, amask = _batch(hf.config.vocab_size)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=amask, output_hidden_states=True)
        hidden = hf.model(input_ids=ids, attention_mask=amask).last_hidden_state
    return {"mlm": out.logits.numpy(), "hidden": hidden.numpy(), "vocab": hf.config.vocab_size}


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    """(root, transformers' outputs): ``root/hf`` imported to ``root/ckpt`` through the CLI with --verify."""
    return imported(tmp_path_factory, "hf_modernbert", _make_mlm)


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_imported_modernbert_logits_equal_transformers(modernbert, tp):
    root, ref = modernbert
    if tp == 1:  # import hf --verify compared transformers' own class from the folder with the written checkpoint
        report = ref["import"]["verify"]
        assert report["verified"] and report["max_abs_diff"] < 1e-4, report
    res = [r for r in run_world(tp, our_logits, str(root / "ckpt"), tp, _batch(ref["vocab"])) if r is not None]
    assert len(res) == 1 and res[0]["family"] == "modernbert" and res[0]["type"] == "ModernBertModel", res
    assert res[0]["binary"] is None
    valid = _batch(ref["vocab"])[1].bool().numpy()
    mlm = masked_max_diff(res[0]["mlm"], ref["mlm"], valid)
    assert abs(ref["mlm"]).max() > 1.0  # non-trivial logits
    assert mlm < 1e-4, mlm
    assert res[0]["padded_max"] == float("-inf")  # padded vocabulary entries are never predicted


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForMaskedLM

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    ids, amask = _batch(hf.config.vocab_size)
    with torch.no_grad():
        res = hf(input_ids=ids, attention_mask=amask)
    return {"class": info["class"], "loaded": type(hf).__name__, "mlm": res.logits.numpy(),
            "config": json.loads(open(f"{out}/config.json").read())}


def test_export_hf_loads_in_transformers_with_same_logits(modernbert):
    root, ref = modernbert
    (res,) = run_world(1, _export_and_reload, str(root / "ckpt"), str(root / "export"))
    assert res["class"] == res["loaded"] == "ModernBertForMaskedLM", res["class"]
    cfg = res["config"]
    assert (cfg["model_type"], cfg["norm_eps"], cfg["local_attention"], cfg["pad_token_id"],
            cfg["layer_types"]) == ("modernbert", 1e-6, 8, 0, ["full_attention", "sliding_attention",
                                                               "sliding_attention", "full_attention"]), cfg
    assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 1000.0, cfg["rope_parameters"]
    assert cfg["rope_parameters"]["sliding_attention"]["rope_theta"] == 50.0, cfg["rope_parameters"]
    valid = _batch(ref["vocab"])[1].bool().numpy()
    assert masked_max_diff(res["mlm"], ref["mlm"], valid) < 1e-4


def test_fine_tuning_encoder_equals_modernbert_model(modernbert):
    root, ref = modernbert
    ids, amask = _batch(ref["vocab"])
    for source in ("ckpt", "hf"):
        (diff,) = run_world(1, encoder_hidden, str(root / source), ids, amask, 0 * ids, ref["hidden"])
        assert diff < 1e-4, (source, diff)


def _window_and_rope(ckpt: str) -> dict:
    """Layer outputs of the imported model: (a) the hidden state of token 0 after each layer when token 20 (outside
    the 8-token window: |0 - 20| > 4) changes; (b) attention scores of a layer's query/key with positions shifted
    (rotary: scores depend on position differences only)."""
    import torch

    from bio_megatron.models.modernbert import rope_table
    from bio_megatron.formats.verify import load_pretraining
    from megatron.core.models.common.embeddings.rotary_pos_embedding import apply_rotary_pos_emb

    model, m, tok = load_pretraining(ckpt)
    ids, amask = _batch(tok.vocab_size)
    ids, amask = ids[:1], amask[:1]
    other = ids.clone()
    other[0, 20] = (ids[0, 20] + 1) % tok.vocab_size
    outs = []
    for batch in (ids, other):
        hidden, per_layer = model.embedding(input_ids=batch), []
        from bio_megatron.models.modernbert import attention_mask_for

        for layer in model.encoder.layers:
            hidden, _ = layer(hidden_states=hidden, attention_mask=attention_mask_for(amask))
            per_layer.append(hidden[0, 0].detach().clone())
        outs.append(per_layer)
    changed = [float((a - b).abs().max()) for a, b in zip(*outs)]
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(16, 1, 1, 16, generator=g), torch.randn(16, 1, 1, 16, generator=g)
    table = rope_table(16 + 5, 16, 1000.0, q.device)
    scores = []
    for shift in (0, 5):
        qr = apply_rotary_pos_emb(q, table[shift:shift + 16], config=model.config)
        kr = apply_rotary_pos_emb(k, table[shift:shift + 16], config=model.config)
        scores.append(torch.einsum("sbhd,tbhd->st", qr, kr))
    return {"changed": changed, "rope_shift": float((scores[0] - scores[1]).abs().max()),
            "scale": float(scores[0].abs().max())}


def test_local_layers_do_not_see_past_their_window_and_rope_is_relative(modernbert):
    """Token 0's output after layer 1 (local, window 8: keys 0..4) is unchanged when token 20 changes; after layer
    0 (global) it changes; rotary scores are unchanged when every position shifts by 5."""
    root, _ = modernbert
    (res,) = run_world(1, _window_and_rope, str(root / "ckpt"))
    changed = res["changed"]
    # layer 0 is global: token 0 sees token 20 there, and everything downstream carries it
    assert changed[0] > 1e-3, changed
    assert res["scale"] > 1.0 and res["rope_shift"] < 1e-4, res


def _local_only(ckpt: str) -> float:
    """Token 0 after one local layer applied to the embedding alone, with token 20 changed: no difference."""
    import torch

    from bio_megatron.formats.verify import load_pretraining
    from bio_megatron.models.modernbert import attention_mask_for

    model, m, tok = load_pretraining(ckpt)
    ids, amask = _batch(tok.vocab_size)
    ids, amask = ids[:1], amask[:1]
    other = ids.clone()
    other[0, 20] = (ids[0, 20] + 1) % tok.vocab_size
    local, glob = model.encoder.layers[1], model.encoder.layers[0]
    res = []
    for layer in (local, glob):
        outs = [layer(hidden_states=model.embedding(input_ids=b), attention_mask=attention_mask_for(amask))[0][0, 0]
                for b in (ids, other)]
        res.append(float((outs[0] - outs[1]).abs().max()))
    return res


def test_a_local_layer_ignores_tokens_outside_its_window(modernbert):
    root, _ = modernbert
    ((local, glob),) = run_world(1, _local_only, str(root / "ckpt"))
    assert local == 0.0 and glob > 1e-3, (local, glob)


def _write_bad(folder: str) -> None:
    from transformers import ModernBertForMaskedLM

    cfg = _config(layer_types=["full_attention", "full_attention", "sliding_attention", "full_attention"],
                  architectures=["ModernBertForMaskedLM"])
    ModernBertForMaskedLM(cfg).save_pretrained(folder)
    shutil.copyfile(VOCAB_FILE, f"{folder}/vocab.txt")


def test_unsupported_attention_pattern_is_refused_in_one_line(tmp_path):
    """HF's layer_types with global layers 0, 1, 3 (not "every N-th"): exit 2, one line naming the file and the
    option; nothing written at --out."""
    text = import_refusal(_write_bad, tmp_path)
    assert "config.json" in text and "layer_types" in text and "[0, 1, 3]" in text, text


def _packed_vs_separate(ckpt: str) -> dict:
    """Two documents (lengths 13 and 11) packed into one row (padding mask 1 ... 2 ... 0, as data/packing.py numbers
    them) vs each alone in its own padded row: the MLM logits of every real token."""
    import torch

    from bio_megatron.formats.verify import load_pretraining

    model, _, tok = load_pretraining(ckpt)
    ids, _ = _batch(tok.vocab_size)
    a, b = ids[0, :13], ids[1, :11]
    packed = torch.zeros(1, SEQ, dtype=torch.long)
    packed[0, :24] = torch.cat([a, b])
    segments = torch.zeros(1, SEQ, dtype=torch.long)
    segments[0, :13], segments[0, 13:24] = 1, 2
    alone = torch.zeros(2, SEQ, dtype=torch.long)
    alone[0, :13], alone[1, :11] = a, b
    mask = (alone > 0).long()
    mask[0, :13], mask[1, :11] = 1, 1
    with torch.no_grad():
        together = model(packed, segments)[0][0, :24, :tok.vocab_size]
        apart = model(alone, mask)[0]
    apart = torch.cat([apart[0, :13], apart[1, :11]])[:, :tok.vocab_size]
    return {"diff": float((together - apart).abs().max()), "scale": float(apart.abs().max())}


def test_packed_documents_do_not_attend_across(modernbert):
    """A packed row (block-diagonal attention; rotary positions restart per document, though rotary scores depend
    on distances only) gives each document's tokens the logits they have alone: the rows data/packing.py makes
    (model.data.packing: documents, objective mlm) train ModernBERT without cross-document attention
    (test_modernbert_packing.py runs that pretraining)."""
    root, _ = modernbert
    (res,) = run_world(1, _packed_vs_separate, str(root / "ckpt"))
    assert res["scale"] > 1.0 and res["diff"] < 1e-4, res
