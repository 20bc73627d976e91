"""RE and QA fine-tuning on real slices (ChemProt SciBERT lines, a SQuAD v2 slice with unanswerable
questions): TP2 equals TP1, and the exported MegatronBertFor{SequenceClassification,QuestionAnswering}
gives our logits."""

from __future__ import annotations

import pytest
from ft_runs import finetune_rank
from harness import run_world

QUICK = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "model.dataset.max_eval_examples=16"]
HEADLESS = {"re": "model.classifier_head.fc_dropout=0.0", "qa": "model.head.fc_dropout=0.0"}


def _export_compare(task: str, ckpt: str, out: str) -> dict:
    import torch
    import transformers

    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned

    info = export_hf(ckpt, out)
    loaded = load_finetuned(ckpt)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["Which drug inhibits @GENE$?", "What is the capital?"],
              ["@CHEMICAL$ inhibits the enzyme strongly.", "Paris is the capital of France."],
              padding=True, return_tensors="pt")
    hf = getattr(transformers, info["class"]).from_pretrained(out).eval()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        out_hf = hf(**enc)
    if task == "re":
        diff, scale = (ours - out_hf.logits).abs().max().item(), ours.abs().max().item()
    else:
        valid = enc["attention_mask"].bool()
        theirs = torch.stack([out_hf.start_logits, out_hf.end_logits], -1)
        diff, scale = (ours - theirs)[valid].abs().max().item(), ours[valid].abs().max().item()
    res = {"class": info["class"], "diff": diff, "scale": scale}
    if task == "qa":  # predict qa over given contexts, with the checkpoint's own QA settings
        from bio_megatron.predict.qa import answer
        from bio_megatron.tasks.qa_data import QAExample

        contexts = {"a": "Naloxone reverses the antihypertensive effect of clonidine.", "b": "Paris is in France."}
        preds, nbest = answer(loaded, [QAExample(k, "What reverses it?", c) for k, c in contexts.items()])
        res["qa_ok"] = sorted(preds) == ["a", "b"] and all(p in contexts[k] for k, p in preds.items()) and \
            all(abs(sum(n["probability"] for n in nbest[k]) - 1) < 1e-6 for k in nbest)
    return res


@pytest.mark.parametrize("task", ["re", "qa"])
def test_tp2_equals_tp1_and_export_matches(tmp_path, task):
    base = QUICK + [HEADLESS[task], f"exp_manager.exp_dir={tmp_path}"]
    ref = run_world(1, finetune_rank, task, base + ["exp_manager.name=tp1"])[0]
    tp2 = run_world(2, finetune_rank, task, base + ["exp_manager.name=tp2", "model.tensor_model_parallel_size=2"])
    assert len(ref["losses"]) == 3
    for res in tp2:
        assert max(abs(a - b) for a, b in zip(res["losses"], ref["losses"])) < 1e-5, (res["losses"], ref["losses"])
    assert abs(tp2[0]["dev"]["f1"] - ref["dev"]["f1"]) < 1e-9
    if task == "qa":  # the official SQuAD v2 keys, unanswerable questions included
        assert ref["dev"]["NoAns_total"] > 0 and ref["dev"]["HasAns_total"] > 0
    (res,) = run_world(1, _export_compare, task, str(tmp_path / "tp2" / "checkpoints"), str(tmp_path / "hf"))
    assert res["class"] == {"re": "MegatronBertForSequenceClassification",
                            "qa": "MegatronBertForQuestionAnswering"}[task]
    assert res["scale"] > 1e-3 and res["diff"] < 1e-4, res
    assert res.get("qa_ok", task == "re"), res
