"""Outside oracle for RoBERTa: a random tiny Hugging Face ``RobertaForMaskedLM`` (byte-level BPE vocabulary
trained here, positions offset by ``padding_idx + 1``, one token type) imported with ``import hf`` gives
transformers' MLM logits at TP1 and, resharded by dist-checkpointing, at TP2xPP2 (right-padded batch, real
positions compared); ``export hf`` writes a ``RobertaForMaskedLM`` folder transformers loads with the same
logits. Fine-tuning from it: ``test_roberta_finetune.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
    with torch.no_grad():  # LayerNorm gains and all biases too, so that no mapping hides behind 1s and 0s
        for name, p in hf.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.1)
    hf.save_pretrained(folder)
    ids, amask = _batch(vocab)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=amask).logits
    return {"vocab": vocab, "mlm": logits.numpy()}


def _batch(vocab: int):
    """Right-padded: real tokens never the pad id (HF derives positions from ``input_ids != pad``)."""
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, vocab, (3, SEQ), generator=g)
    ids[:, 0] = 0  # <s>
    lens = torch.tensor([SEQ, 17, 9])
    amask = (torch.arange(SEQ)[None] < lens[:, None]).long()
    return ids.masked_fill(amask == 0, PAD), amask


def _import(hf_dir: str, out: str) -> dict:
    from bio_megatron.export.hf import import_hf

    return import_hf(hf_dir, out)


def _our_logits(ckpt: str, tp: int, pp: int):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.tasks.model import resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint
    from bio_megatron.vocab.bpe import load_tokenizer

    init_distributed()
    init_model_parallel(tp, pp, seed=1)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                    bert_binary_head=False, hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local",
                    attention_backend="unfused")
    m.make_vocab_size_divisible_by = src.padded_vocab // tp
    vocab = load_tokenizer(src.vocab_file).vocab_size
    model = build_model(m, vocab).eval()
    load_checkpoint(src.path, model, model_only=True)
    ids, amask = _batch(vocab)

    def step(_, mdl):
        out = mdl(ids, amask, tokentype_ids=torch.zeros_like(ids))
        if not ps.is_pipeline_last_stage():
            return out, None
        logits = out[0] if isinstance(out, tuple) else out
        return logits, lambda t, non_loss_data=True: gather_from_tensor_model_parallel_region(t)

    with torch.no_grad():
        data = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[model],
                                           num_microbatches=1, seq_length=SEQ, micro_batch_size=3,
                                           forward_only=True, collect_non_loss_data=True)
    if not (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0):
        return None
    return {"mlm": data[0][..., :vocab].numpy(), "shape": src.shape, "vocab_file": Path(src.vocab_file).name}


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForMaskedLM

    from bio_megatron.export.hf import export_hf

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
    root = tmp_path_factory.mktemp("hf_roberta")
    (ref,) = run_world(1, _make_hf, str(root / "hf"))
    (info,) = run_world(1, _import, str(root / "hf"), str(root / "ckpt"))
    assert info["task"] is None
    return root, ref


def _diff(got, ref: dict) -> float:
    valid = _batch(ref["vocab"])[1].bool().numpy()  # padded query rows differ by design (masked in megatron)
    return float(abs(got - ref["mlm"])[valid].max())


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
    from bio_megatron.tasks.model import resolve_source
    from bio_megatron.utils.errors import CheckpointError

    root, _ = imported
    folder = tmp_path / "tok_cls"
    folder.mkdir()
    cfg = json.loads((root / "hf" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["RobertaForTokenClassification"]}))
    with pytest.raises(CheckpointError, match="RobertaForTokenClassification"):
        resolve_source(folder)
