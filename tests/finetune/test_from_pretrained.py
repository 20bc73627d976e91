"""Fine-tuning starts from a pretraining checkpoint saved at TP2xPP2 (loaded at TP2 and, through its HF
export, at TP1): both give the same losses; the MaskedLM export of that checkpoint equals our MLM logits."""

from __future__ import annotations

from ft_runs import finetune_rank
from harness import run_world

from engine.pretrain_runs import overrides, pretrain_rank

NO_DROP = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.head.fc_dropout=0.0",
           "trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
           "model.dataset.test_file=null"]


def _export_mlm(ckpt: str, out: str) -> dict:
    import torch
    from transformers import MegatronBertForMaskedLM

    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.export.hf import export_hf
    from bio_megatron.models.bert import build_model
    from bio_megatron.tasks.model import resolve_source
    from bio_megatron.training.checkpoint import load_checkpoint

    info = export_hf(ckpt, out)
    src = resolve_source(ckpt)
    m = ModelConfig(**src.shape, hidden_dropout=0.0, attention_dropout=0.0)
    m.make_vocab_size_divisible_by = src.padded_vocab
    vocab = sum(1 for _ in open(src.vocab_file, encoding="utf-8"))
    model = build_model(m, vocab, pre_process=True, post_process=True).eval()
    load_checkpoint(src.path, model, model_only=True)
    ids = torch.randint(5, vocab, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    hf = MegatronBertForMaskedLM.from_pretrained(out).eval()
    with torch.no_grad():
        ours, _ = model(ids, mask, tokentype_ids=torch.zeros_like(ids))
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    return {"class": info["class"], "diff": (ours[..., :vocab] - theirs).abs().max().item(),
            "scale": theirs.abs().max().item()}


def test_finetune_from_tp2pp2_pretraining_checkpoint_and_its_hf_export(tmp_path, pubmed_prefix):
    run_world(4, pretrain_rank, overrides(pubmed_prefix, tmp_path, "pre", tp=2, pp=2, steps=2, save_last=True))
    ckpt = tmp_path / "pre" / "checkpoints"
    (mlm,) = run_world(1, _export_mlm, str(ckpt), str(tmp_path / "hf_mlm"))
    assert mlm["class"] == "MegatronBertForMaskedLM" and mlm["scale"] > 0.1 and mlm["diff"] < 1e-4, mlm
    common = NO_DROP + [f"exp_manager.exp_dir={tmp_path}", "model.max_position_embeddings=64",
                        "model.dataset.max_seq_length=64"]
    from_ckpt = run_world(2, finetune_rank, "ner", common + [f"model.restore_from_path={ckpt}", "exp_manager.name=a",
                                                             "model.tensor_model_parallel_size=2"])[0]
    from_hf = run_world(1, finetune_rank, "ner", common + [f"model.restore_from_path={tmp_path / 'hf_mlm'}",
                                                           "exp_manager.name=b"])[0]
    scratch = run_world(1, finetune_rank, "ner", common + ["model.tokenizer.vocab_file=" + str(ckpt / "iter_0000002" /
                                                                                               "vocab.txt"),
                                                           "exp_manager.name=c"])[0]
    assert max(abs(a - b) for a, b in zip(from_ckpt["losses"], from_hf["losses"])) < 1e-5
    assert abs(from_ckpt["losses"][0] - scratch["losses"][0]) > 1e-4  # the pretrained encoder was really loaded
