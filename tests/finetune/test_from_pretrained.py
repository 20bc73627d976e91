"""Fine-tuning starts from a pretraining checkpoint saved at TP2xPP2 (loaded at TP2 and, through its HF
export, at TP1): both give the same losses; the MaskedLM export of that checkpoint equals our MLM logits."""

from __future__ import annotations

from architectures.hf_parity import export_mlm
from ft_runs import finetune_rank
from harness import run_world

from engine.pretrain_runs import overrides, pretrain_rank

NO_DROP = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.head.fc_dropout=0.0",
           "trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
           "model.dataset.test_file=null"]


def test_finetune_from_tp2pp2_pretraining_checkpoint_and_its_hf_export(tmp_path, pubmed_prefix):
    run_world(4, pretrain_rank, overrides(pubmed_prefix, tmp_path, "pre", tp=2, pp=2, steps=2, save_last=True))
    ckpt = tmp_path / "pre" / "checkpoints"
    (mlm,) = run_world(1, export_mlm, str(ckpt), str(tmp_path / "hf_mlm"))
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
