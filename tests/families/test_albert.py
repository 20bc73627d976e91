"""Outside oracle for ALBERT: a random tiny Hugging Face ``AlbertForPreTraining`` (factorised embedding E = 32 ->
H = 64, one layer shared by 3 applications, gelu_new, SOP head, LayerNorm eps 1e-7 to show it is carried) imported
with ``bio-megatron import hf --verify`` gives transformers' MLM and SOP logits on a padded batch at TP1 and,
resharded by dist-checkpointing, at TP2; ``export hf`` writes a folder transformers loads as AlbertForPreTraining
with the same logits; token-classification, sequence-classification and QA folders round-trip through import and
export; fine-tuning's encoder
(``TaskModel`` through ``Family.task_encoder``) gives AlbertModel's hidden states; what the engine cannot hold is
refused in one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil

import pytest
from architectures.hf_parity import (VOCAB_FILE, import_hf_folder, imported, masked_max_diff, padded_batch,
                                     perturb_norms_and_biases, vocab_lines)
from harness import run_world
from layouts import encoder_hidden, import_refusal, our_logits
from reliability.cli_log import run_cli
from reliability.files import tree_digest

SEQ, E, H, LAYERS = 32, 32, 64, 3
LABELS = ["O", "B-Chemical", "I-Chemical"]


def _config(**extra):
    from transformers import AlbertConfig

    fields = dict(vocab_size=vocab_lines(), embedding_size=E, hidden_size=H, num_hidden_layers=LAYERS,
                  num_attention_heads=4, intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                  layer_norm_eps=1e-7, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  classifier_dropout_prob=0.0, initializer_range=0.2, hidden_act="gelu_new")
    return AlbertConfig(**{**fields, **extra})


def _batch(vocab: int):
    ids, amask, types = padded_batch(vocab, SEQ, (SEQ, 21, 9))
    return ids * amask, amask, types


def _save(model, folder: str) -> None:
    model.save_pretrained(folder)
    shutil.copyfile(VOCAB_FILE, f"{folder}/vocab.txt")


def _make_pretraining(folder: str) -> dict:
    """The random HF AlbertForPreTraining folder and transformers' logits and hidden states on the batch."""
    import torch
    from transformers import AlbertForPreTraining

    torch.manual_seed(0)
    hf = AlbertForPreTraining(_config(architectures=["AlbertForPreTraining"])).eval()
    perturb_norms_and_biases(hf)
    _save(hf, folder)
    ids, amask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=amask, token_type_ids=types, output_hidden_states=True)
    return {"mlm": out.prediction_logits.numpy(), "sop": out.sop_logits.numpy(),
            "hidden": out.hidden_states[-1].numpy(), "vocab": hf.config.vocab_size}


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    """(root, transformers' outputs): ``root/hf`` imported to ``root/ckpt`` through the CLI with --verify."""
    return imported(tmp_path_factory, "hf_albert", _make_pretraining)


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_imported_albert_logits_equal_transformers(albert, tp):
    root, ref = albert
    if tp == 1:  # import hf --verify compared transformers' own class from the folder with the written checkpoint
        report = ref["import"]["verify"]
        assert report["verified"] and report["max_abs_diff"] < 1e-4, report
    ranks = run_world(tp, our_logits, str(root / "ckpt"), tp, _batch(ref["vocab"]), {"bert_binary_head": True})
    res = [r for r in ranks if r is not None]
    assert len(res) == 1 and res[0]["family"] == "albert" and res[0]["type"] == "AlbertModel", res
    valid = _batch(ref["vocab"])[1].bool().numpy()
    mlm, sop = masked_max_diff(res[0]["mlm"], ref["mlm"], valid), float(abs(res[0]["binary"] - ref["sop"]).max())
    assert abs(ref["mlm"]).max() > 1.0 and abs(ref["sop"]).max() > 0.05  # non-trivial logits
    assert mlm < 1e-4 and sop < 1e-4, (mlm, sop)
    assert res[0]["padded_max"] == float("-inf")  # padded vocabulary entries are never predicted
    print(f"albert import tp{tp}: max |ours - transformers| MLM {mlm:.2e}, SOP {sop:.2e}")


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForPreTraining, AutoTokenizer

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = AutoModelForPreTraining.from_pretrained(out).eval()
    ids, amask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        res = hf(input_ids=ids, attention_mask=amask, token_type_ids=types)
    return {"class": info["class"], "loaded": type(hf).__name__, "mlm": res.prediction_logits.numpy(),
            "sop": res.sop_logits.numpy(), "config": json.loads(open(f"{out}/config.json").read()),
            "tokens": AutoTokenizer.from_pretrained(out)("Naloxone")["input_ids"]}


def test_export_hf_loads_in_transformers_with_same_logits(albert):
    root, ref = albert
    (res,) = run_world(1, _export_and_reload, str(root / "ckpt"), str(root / "export"))
    assert res["class"] == res["loaded"] == "AlbertForPreTraining", res["class"]
    cfg = res["config"]
    assert (cfg["model_type"], cfg["embedding_size"], cfg["num_hidden_groups"], cfg["inner_group_num"],
            cfg["hidden_act"], cfg["layer_norm_eps"]) == ("albert", E, 1, 1, "gelu_new", 1e-7), cfg
    valid = _batch(ref["vocab"])[1].bool().numpy()
    mlm, sop = masked_max_diff(res["mlm"], ref["mlm"], valid), float(abs(res["sop"] - ref["sop"]).max())
    assert mlm < 1e-4 and sop < 1e-4, (mlm, sop)
    assert len(res["tokens"]) > 2


def test_fine_tuning_encoder_equals_albert_model(albert):
    root, ref = albert
    for source in ("ckpt", "hf"):
        (diff,) = run_world(1, encoder_hidden, str(root / source), *_batch(ref["vocab"]), ref["hidden"])
        assert diff < 1e-4, (source, diff)


TASK_CLASSES = {"ner": "AlbertForTokenClassification", "re": "AlbertForSequenceClassification",
                "qa": "AlbertForQuestionAnswering"}


def _logits(out):
    import torch

    if hasattr(out, "start_logits"):  # our QA head gives [B, S, 2]
        return torch.stack([out.start_logits, out.end_logits], dim=-1).numpy()
    return out.logits.numpy()


def _make_task_folder(folder: str, task: str) -> dict:
    import torch
    import transformers

    torch.manual_seed(1)
    labels = {} if task == "qa" else dict(num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
                                            label2id={t: i for i, t in enumerate(LABELS)})
    cfg = _config(architectures=[TASK_CLASSES[task]], **labels)
    hf = getattr(transformers, TASK_CLASSES[task])(cfg).eval()
    perturb_norms_and_biases(hf)
    _save(hf, folder)
    ids, amask, types = _batch(cfg.vocab_size)
    with torch.no_grad():
        return {"logits": _logits(hf(input_ids=ids, attention_mask=amask, token_type_ids=types))}


def _export_task(ckpt: str, out: str) -> dict:
    import torch
    import transformers

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = getattr(transformers, info["class"]).from_pretrained(out).eval()
    ids, amask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        logits = _logits(hf(input_ids=ids, attention_mask=amask, token_type_ids=types))
    return {"class": info["class"], "loaded": type(hf).__name__, "logits": logits, "labels": info["labels"]}


def _each(fn, *folders_and_tasks) -> list:
    """``fn`` over several (arguments...) in one forked process: one start-up for the three task folders."""
    return [fn(*args) for args in folders_and_tasks]


def test_task_folders_round_trip(tmp_path):
    """HF Albert{TokenClassification,SequenceClassification,QuestionAnswering} folders import (--verify: transformers'
    class vs our fine-tuning model) as fine-tuned checkpoints of their task and export back to the same class with
    the same logits (RE's head is ALBERT's own pooler, ``albert.pooler``, + classifier)."""
    tasks = list(TASK_CLASSES)
    (refs,) = run_world(1, _each, _make_task_folder, *[(str(tmp_path / t / "hf"), t) for t in tasks])
    (infos,) = run_world(1, _each, import_hf_folder, *[(str(tmp_path / t / "hf"), str(tmp_path / t / "ckpt"))
                                                       for t in tasks])
    (results,) = run_world(1, _each, _export_task, *[(str(tmp_path / t / "ckpt"), str(tmp_path / t / "export"))
                                                     for t in tasks])
    valid = _batch(vocab_lines())[1].bool().numpy()
    for task, ref, info, res in zip(tasks, refs, infos, results):
        assert info["rc"] == 0 and info["task"] == task, info
        assert info["labels"] == (None if task == "qa" else LABELS), info
        assert info["verify"]["verified"] and info["verify"]["max_abs_diff"] < 1e-4, info["verify"]
        assert res["class"] == res["loaded"] == TASK_CLASSES[task], res
        got, want = res["logits"], ref["logits"]
        diff = float(abs(got - want).max()) if task == "re" else masked_max_diff(got, want, valid)
        assert abs(want).max() > 0.01 and diff < 1e-4, (task, diff)


def _write_grouped(folder: str) -> None:
    from transformers import AlbertForMaskedLM

    _save(AlbertForMaskedLM(_config(num_hidden_groups=2, architectures=["AlbertForMaskedLM"])), folder)


def test_unsupported_grouping_is_refused_in_one_line(tmp_path):
    """HF's num_hidden_groups 2 (two distinct layers): exit 2, one line naming the file, key and value; nothing
    written at --out."""
    text = import_refusal(_write_grouped, tmp_path)
    assert "config.json" in text and "num_hidden_groups 2" in text, text


@pytest.mark.parametrize("command", [["export", "nemo"], ["export", "megatron-lm"]], ids=["nemo", "megatron-lm"])
def test_export_to_formats_without_sharing_is_refused(albert, tmp_path, command):
    """NeMo's and Megatron-LM's BERT hold num_layers distinct layers and a hidden-wide embedding: an ALBERT
    checkpoint is refused in one line naming the family, exit 2, nothing written."""
    root, _ = albert
    before = tree_digest(root / "ckpt")
    out = tmp_path / ("model.nemo" if command[1] == "nemo" else "mlm")
    # the exporters load checkpoints in a TP1 process group: run the CLI in a forked world, as a user's process
    (rc, text), = run_world(1, run_cli, [*command, "--checkpoint", str(root / "ckpt"), "--out", str(out)],
                            40, "\n")
    assert rc == 2 and len(text.splitlines()) == 1 and "albert" in text, text
    assert not out.exists() and tree_digest(root / "ckpt") == before


def _export_finetuned_ner(ckpt: str, out: str, text_file: str, pred: str) -> dict:
    """``predict ner`` through the CLI, then ``export hf`` of the fine-tuned checkpoint: transformers'
    AlbertForTokenClassification from the folder vs our fine-tuned model on a padded pair of sentences."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from bio_megatron.cli import main
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned

    rc = main(["predict", "ner", "--checkpoint", ckpt, "--input", text_file, "--out", pred])
    info = export_hf(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(["Naloxone reverses the effect of clonidine.", "Cocaine"], padding=True, return_tensors="pt")
    loaded = load_finetuned(ckpt)
    hf = AutoModelForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
        theirs = hf(**enc).logits
    valid = enc["attention_mask"].bool()
    return {"predict_rc": rc, "class": info["class"], "loaded": type(hf).__name__, "family": loaded.cfg.model.family,
            "diff": masked_max_diff(ours, theirs, valid), "scale": float(ours[valid].abs().max())}


def test_finetune_ner_from_imported_albert_predicts_and_exports(albert, tmp_path):
    """``finetune ner`` (3 steps) starts from the imported ALBERT; ``predict ner`` reads the fine-tuned checkpoint;
    its ``export hf`` is transformers' AlbertForTokenClassification with our logits."""
    from finetune.ft_runs import finetune_rank

    root, _ = albert
    over = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=ner", f"model.restore_from_path={root / 'ckpt'}"]
    (run,) = run_world(1, finetune_rank, "ner", over)
    assert len(run["losses"]) == 3 and all(0.0 < v < 10.0 for v in run["losses"]), run["losses"]
    text = tmp_path / "docs.txt"
    text.write_text("Naloxone reverses the antihypertensive effect of clonidine.\nCocaine\n", encoding="utf-8")
    (res,) = run_world(1, _export_finetuned_ner, str(tmp_path / "ner" / "checkpoints"), str(tmp_path / "hf_ner"),
                       str(text), str(tmp_path / "pred.jsonl"))
    assert res["predict_rc"] == 0 and len((tmp_path / "pred.jsonl").read_text().splitlines()) == 2, res
    assert res["family"] == "albert" and res["class"] == res["loaded"] == "AlbertForTokenClassification", res
    assert res["scale"] > 0.01 and res["diff"] < 1e-4, res


@pytest.mark.parametrize("over, needle", [
    (["model.embedding_size=32", "model.family=bert"], "model.embedding_size (32) applies to model.family albert only"),
    (["model.family=albert", "model.transformer_block_type=pre_ln"], "model.family (albert) is post-LN"),
    (["model.family=albert", "model.transformer_block_type=post_ln", "model.sequence_parallel=true",
      "model.tensor_model_parallel_size=2"], "model.sequence_parallel (true) is not implemented for model.family albert"),
], ids=["embedding_size_elsewhere", "pre_ln", "sequence_parallel"])
def test_albert_keys_are_checked_with_the_config(over, needle):
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.utils.errors import ConfigError

    tiny = VOCAB_FILE.parents[3] / "nemo_configs" / "pretrain" / "tiny.yaml"
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(tiny, over)
    assert needle in str(err.value), str(err.value)


def _bare_encoder(root: str, theirs) -> dict:
    """The fixture's AlbertModel alone (no MLM or SOP head, weights saved without the ``albert.`` prefix), imported
    through the CLI (a fresh MLM head), then fine-tuning's encoder filled from the checkpoint."""
    import torch
    from transformers import AlbertForPreTraining

    from bio_megatron.cli import main
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    from architectures.hf_parity import encoder_hidden_diff

    bare = AlbertForPreTraining.from_pretrained(f"{root}/hf").albert
    bare.config.architectures = ["AlbertModel"]
    _save(bare, f"{root}/bare")
    rc = main(["import", "hf", "--model", f"{root}/bare", "--out", f"{root}/bare_ckpt"])
    init_distributed()
    init_model_parallel(1, 1, seed=1)
    return {"rc": rc, "diff": encoder_hidden_diff(f"{root}/bare_ckpt", *_batch(vocab_lines()),
                                                  torch.from_numpy(theirs))}


def test_bare_albert_model_imports_with_a_fresh_mlm_head(albert):
    root, ref = albert
    (res,) = run_world(1, _bare_encoder, str(root), ref["hidden"])
    assert res["rc"] == 0 and res["diff"] < 1e-4, res


def _layer_depths_of_albert(ckpt: str) -> str:
    """ELECTRA's layer depths (training/optimizer.py) asked of fine-tuning's ALBERT model: the guard's message, or
    what it returned."""
    import torch
    from torch import nn

    from bio_megatron.config.finetune import NerModelConfig
    from bio_megatron.families.task import build_task_model
    from bio_megatron.formats.source import apply_source_shape, resolve_source
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.training.optimizer import layer_depths

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    src = resolve_source(ckpt)
    m = NerModelConfig(transformer_impl="local")
    apply_source_shape(m, src)
    model = build_task_model(m, src.padded_vocab, nn.Identity(), torch.float32, seed=0, pre_process=True,
                             post_process=True)
    try:
        return f"depths {sorted(set(layer_depths([model])[0].values()))}"
    except ValueError as err:
        return str(err)


def test_layerwise_lr_decay_is_refused_for_the_shared_layer(albert, tmp_path):
    """ELECTRA's layer-wise decay gives layer l the rate of depth l + 1; ALBERT's one layer runs at every depth, so
    it has none (it used to get depth 1's, lr * d^L): ``finetune ner`` from an ALBERT checkpoint with the key is one
    config problem naming key, value and family, exit 2, nothing written; the optimizer's depth count refuses the shared
    layer too."""
    root, _ = albert
    exp = tmp_path / "runs"
    # in a forked world: were the key accepted, the run would set up torch.distributed there, not in pytest
    (rc, text), = run_world(1, run_cli, [
        "finetune", "ner", "--config", "tiny_ner", f"model.restore_from_path={root / 'ckpt'}",
        f"model.dataset.data_dir={VOCAB_FILE.parents[3] / 'tests' / 'fixtures' / 'finetune'}",
        "model.dataset.max_seq_length=64", "trainer.max_steps=1", f"exp_manager.exp_dir={exp}",
        "model.optim.layerwise_lr_decay=0.8"], 40, "\n")
    problems = [ln for ln in text.splitlines() if ln.lstrip().startswith("- ")]  # the config's list of problems
    assert rc == 2 and len(problems) == 1, text
    assert "model.optim.layerwise_lr_decay (0.8)" in problems[0] and "model.family albert" in problems[0], text
    assert not exp.exists()
    (guard,) = run_world(1, _layer_depths_of_albert, str(root / "ckpt"))
    assert "run at 3 depths (shared weights)" in guard, guard
