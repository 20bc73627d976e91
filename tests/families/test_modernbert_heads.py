"""ModernBERT's task classes: random tiny HF ``ModernBertFor{TokenClassification,SequenceClassification,
QuestionAnswering}`` folders (perturbed LayerNorm gains and classifier bias, eager attention, an 8-token local window)
import with ``bio-megatron import hf --verify`` (transformers' own class against our fine-tuning model on a padded
batch) and export back to the same class with the same logits (< 1e-4), a ``classifier_pooling: mean`` folder
too; ``finetune ner`` and ``finetune classify`` from an imported
``ModernBertForMaskedLM`` run, ``predict`` reads the fine-tuned checkpoints and ``export hf`` gives transformers'
classes with our logits; a fine-tuning model from an MLM model starts its head's dense and norm from the MLM head's,
as transformers' ``from_pretrained`` does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from architectures.hf_parity import (VOCAB_FILE, import_hf_folder, imported, masked_max_diff, padded_batch,
                                     perturb_norms_and_biases, vocab_lines)
from harness import run_world
from reliability.cli_log import run_cli
from reliability.files import tree_digest

ROOT = Path(__file__).resolve().parents[2]
SEQ = 32
TASK_CLASSES = {"ner": "ModernBertForTokenClassification", "re": "ModernBertForSequenceClassification",
                "qa": "ModernBertForQuestionAnswering"}
LABELS = ["O", "B-Chemical", "I-Chemical"]


def _config(**extra):
    from transformers import ModernBertConfig

    fields = dict(vocab_size=vocab_lines(), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=96, max_position_embeddings=128, norm_eps=1e-6, local_attention=8,
                  global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=50.0,
                  initializer_range=0.2, pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101,
                  eos_token_id=102, attn_implementation="eager")
    return ModernBertConfig(**{**fields, **extra})


def _batch(vocab: int):
    ids, amask, _ = padded_batch(vocab, SEQ, (SEQ, 21, 9))
    return ids * amask, amask


def _logits(out):
    import torch

    if hasattr(out, "start_logits"):  # our QA head gives [B, S, 2]
        return torch.stack([out.start_logits, out.end_logits], dim=-1).numpy()
    return out.logits.numpy()


def _save(model, folder: str) -> None:
    model.save_pretrained(folder)
    shutil.copyfile(VOCAB_FILE, f"{folder}/vocab.txt")


def _make_task_folder(folder: str, task: str, **extra) -> dict:
    import torch
    import transformers

    torch.manual_seed(1)
    labels = {} if task == "qa" else dict(num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
                                            label2id={t: i for i, t in enumerate(LABELS)})
    hf = getattr(transformers, TASK_CLASSES[task])(_config(architectures=[TASK_CLASSES[task]], **labels, **extra))
    perturb_norms_and_biases(hf.eval())
    _save(hf, folder)
    with torch.no_grad():
        return {"logits": _logits(hf(*_batch(hf.config.vocab_size)))}


def _export_task(ckpt: str, out: str) -> dict:
    import json

    import torch
    import transformers

    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    hf = getattr(transformers, info["class"]).from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = _logits(hf(*_batch(hf.config.vocab_size)))
    return {"class": info["class"], "loaded": type(hf).__name__, "logits": logits, "labels": info["labels"],
            "config": json.loads(Path(out, "config.json").read_text())}


def _each(fn, *args_list) -> list:
    """``fn`` over several argument tuples in one forked process: one start-up for the three folders."""
    return [fn(*args) for args in args_list]


def test_task_folders_import_and_export_with_transformers_logits(tmp_path):
    """Each task class imports as a fine-tuned checkpoint of its task (--verify within 1e-4: transformers' class vs
    our encoder + ModernBERT head) and exports to the same class with the same logits; the [CLS]-pooled sequence
    head included."""
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
        assert res["config"]["classifier_pooling"] == "cls" and res["config"]["model_type"] == "modernbert"
        got, want = res["logits"], ref["logits"]
        diff = float(abs(got - want).max()) if task == "re" else masked_max_diff(got, want, valid)
        assert abs(want).max() > 0.1 and diff < 1e-4, (task, diff)


def _make_mean_pooled(folder: str) -> dict:
    return _make_task_folder(folder, "re", classifier_pooling="mean")


def test_mean_pooled_sequence_classifier_imports_and_exports_with_transformers_logits(tmp_path):
    """``classifier_pooling: mean`` (the mean over the padding mask, which TaskModel hands the head): import hf
    --verify within 1e-4 of transformers' class on the padded batch (rows of 32, 21 and 9 tokens), the checkpoint's
    model.classifier_head.pooling is mean, and export hf gives ModernBertForSequenceClassification with
    classifier_pooling mean and the same logits."""
    (ref,) = run_world(1, _make_mean_pooled, str(tmp_path / "hf"))
    (info,) = run_world(1, import_hf_folder, str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    assert info["rc"] == 0 and info["task"] == "re", info
    assert info["verify"]["verified"] and info["verify"]["max_abs_diff"] < 1e-4, info["verify"]
    saved = next((tmp_path / "ckpt").rglob("config.yaml")).read_text()
    assert "pooling: mean" in saved, saved
    (res,) = run_world(1, _export_task, str(tmp_path / "ckpt"), str(tmp_path / "export"))
    assert res["class"] == res["loaded"] == "ModernBertForSequenceClassification", res
    assert res["config"]["classifier_pooling"] == "mean", res["config"]
    diff = float(abs(res["logits"] - ref["logits"]).max())
    assert abs(ref["logits"]).max() > 0.1 and diff < 1e-4, diff


def _make_mlm(folder: str) -> dict:
    import torch
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(0)
    hf = ModernBertForMaskedLM(_config(architectures=["ModernBertForMaskedLM"])).eval()
    perturb_norms_and_biases(hf)
    _save(hf, folder)
    return {"vocab": hf.config.vocab_size}


@pytest.fixture(scope="module")
def modernbert_mlm(tmp_path_factory):
    """(root, ...): a random ModernBertForMaskedLM at ``root/hf`` imported (--verify) to ``root/ckpt``."""
    return imported(tmp_path_factory, "hf_modernbert_mlm", _make_mlm)


def _finetune(task: str, recipe: str, over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)  # recipes name their data relative to the checkout
    res = run_finetuning(load_finetune_config(task, ROOT / "nemo_configs" / recipe, over, 1))
    return {"losses": [h["loss"] for h in res["history"] if "loss" in h], "checkpoint": res.get("checkpoint")}


def _predict_and_export(task: str, ckpt: str, text_file: str, pred: str, out: str) -> dict:
    """``predict <task>`` through the CLI, then ``export hf``: transformers' class from the folder vs our fine-tuned
    model on a padded pair of tokenized sentences."""
    import torch
    import transformers

    from bio_megatron.cli import main
    from bio_megatron.cli.convert import classify_dataset
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned

    rc = main(["predict", task, "--checkpoint", ckpt, "--input", text_file, "--out", pred]) if task != "re" else None
    info = export_hf(ckpt, out, classify_dataset=classify_dataset)  # what export hf hands down
    loaded = load_finetuned(ckpt, default_labels=["0", "1"])
    tok = loaded.tokenizer
    rows = [tok.single(tok.tokenize(t)) for t in ("Naloxone reverses the antihypertensive effect of clonidine.",
                                                    "Cocaine")]
    ids = torch.zeros(2, max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    hf = getattr(transformers, info["class"]).from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = loaded.model(ids, mask, torch.zeros_like(ids))
        theirs = torch.from_numpy(_logits(hf(input_ids=ids, attention_mask=mask)))
    valid = mask.bool() if ours.dim() == 3 else torch.ones(ours.shape[0], dtype=torch.bool)
    return {"predict_rc": rc, "class": info["class"], "loaded": type(hf).__name__,
            "family": loaded.cfg.model.family, "diff": float((ours - theirs).abs()[valid].max()),
            "scale": float(ours[valid].abs().max())}


EXPORTED = {"ner": "ModernBertForTokenClassification", "classify": "ModernBertForSequenceClassification",
            "qa": "ModernBertForQuestionAnswering", "re": "ModernBertForSequenceClassification"}
RECIPES = {"ner": "ner/tiny_ner.yaml", "classify": "classify/tiny_classify.yaml", "qa": "qa/tiny_qa.yaml",
           "re": "re/tiny_re.yaml"}


# qa: 11 s on a loaded machine, its head the token head's with two outputs (the folder round trip above covers it)
@pytest.mark.parametrize("task", [pytest.param(t, marks=pytest.mark.extended) if t == "qa" else t for t in EXPORTED])
def test_finetune_from_imported_modernbert_predicts_and_exports(modernbert_mlm, tmp_path, task):
    """``finetune ner`` / ``classify`` / ``qa`` / ``re`` (3 steps) start from the imported ModernBertForMaskedLM with
    ModernBERT's own head; ``predict`` reads the fine-tuned checkpoint (no ``predict re`` exists); ``export hf`` is
    transformers' ModernBertFor{Token,Sequence}Classification / ModernBertForQuestionAnswering with our logits."""
    root, _ = modernbert_mlm
    over = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path}",
            f"exp_manager.name={task}", f"model.restore_from_path={root / 'ckpt'}"]
    if task == "qa":
        over += ["model.dataset.max_train_examples=16", "model.dataset.max_query_length=16",
                 "model.dataset.doc_stride=32"]
    (run,) = run_world(1, _finetune, task, RECIPES[task], over)
    assert len(run["losses"]) == 3 and all(0.0 < v < 10.0 for v in run["losses"]), run["losses"]
    text = tmp_path / "docs.txt"
    if task == "ner":
        text.write_text("Naloxone reverses the antihypertensive effect of clonidine.\nCocaine\n", encoding="utf-8")
    elif task == "qa":
        text = tmp_path / "questions.jsonl"
        text.write_text(json.dumps({"id": "q1", "question": "What reverses the effect of clonidine?",
                                    "context": "Naloxone reverses the antihypertensive effect of clonidine."}) + "\n",
                        encoding="utf-8")
    else:
        text = ROOT / "tests" / "fixtures" / "blurb" / "GAD" / "test.tsv"
    (res,) = run_world(1, _predict_and_export, task, str(tmp_path / task / "checkpoints"), str(text),
                       str(tmp_path / "pred.jsonl"), str(tmp_path / "hf"))
    if task != "re":
        assert res["predict_rc"] == 0 and (tmp_path / "pred.jsonl").read_text().strip(), res
    assert res["family"] == "modernbert" and res["class"] == res["loaded"] == EXPORTED[task], res
    assert res["scale"] > 0.01 and res["diff"] < 1e-4, res


def _megatron_bert_mlm(folder: str) -> None:
    """A random tiny HF ``MegatronBertForMaskedLM`` (its MLM head ``cls.predictions.transform.*`` perturbed)."""
    import torch
    from transformers import MegatronBertConfig, MegatronBertForMaskedLM

    torch.manual_seed(2)
    hf = MegatronBertForMaskedLM(MegatronBertConfig(
        vocab_size=vocab_lines(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=128, architectures=["MegatronBertForMaskedLM"]))
    perturb_norms_and_biases(hf)
    _save(hf, folder)


def _bare_modernbert(folder: str) -> list[str]:
    """A random tiny HF ``ModernBertModel`` (no MLM head); the tensors transformers' token classifier reports as
    newly initialised when it loads the folder."""
    import torch
    from transformers import ModernBertForTokenClassification, ModernBertModel

    torch.manual_seed(3)
    _save(ModernBertModel(_config(architectures=["ModernBertModel"])), folder)
    _, info = ModernBertForTokenClassification.from_pretrained(folder, num_labels=3, output_loading_info=True)
    return sorted(info["missing_keys"])


def _heads_at_step_zero(sources: dict[str, str], exp_dir: str, *extra: str) -> dict | None:
    """``finetune ner`` (tiny_ner, ``extra`` overrides: a layout) from each source, filled by the run's own loader
    (``tasks.finetune.setup``: the source read, the task model built and loaded): the task head's tensors and the
    same model's as initialised (built again from the same seed, nothing loaded); None on a stage without the head."""
    from megatron.core import parallel_state as ps

    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.families.task import build_task_model
    from bio_megatron.tasks.finetune import setup

    os.chdir(ROOT)
    out: dict = {}
    for name, path in sources.items():
        if name == "megatron_bert":
            _megatron_bert_mlm(path)
        if name == "bare":
            out["bare_missing"] = _bare_modernbert(path)
        over = [f"model.restore_from_path={path}", f"exp_manager.exp_dir={exp_dir}", f"exp_manager.name={name}",
                "model.dataset.max_seq_length=64", "model.dataset.test_file=null", "model.dataset.max_eval_examples=8",
                "model.dataset.max_train_examples=8", *extra]
        cfg = load_finetune_config("ner", ROOT / "nemo_configs" / RECIPES["ner"], over, int(os.environ["WORLD_SIZE"]))
        _, _, task, model, _, dtype, padded = setup(cfg)
        if not ps.is_pipeline_last_stage():
            return None
        fresh = build_task_model(cfg.model, padded, task.build_head(cfg.model), dtype, cfg.trainer.seed)
        out[name] = {"family": model.family.name,
                     "loaded": {f"head.{k}": v.detach().clone().numpy() for k, v in model.head.state_dict().items()},
                     "fresh": {f"head.{k}": v.detach().clone().numpy() for k, v in fresh.head.state_dict().items()}}
    return out


def _each_of(*calls: tuple) -> list:
    """``fn(*args)`` for each ``(fn, *args)`` in one forked process."""
    return [fn(*args) for fn, *args in calls]


def _transformers_head(folder: str) -> dict:
    """transformers' ``ModernBertForTokenClassification.from_pretrained`` of a ``ModernBertForMaskedLM`` folder: its
    head and classifier, the tensors it reported as newly initialised, and the folder's own tensors."""
    from safetensors.torch import load_file
    from transformers import ModernBertForTokenClassification

    hf, info = ModernBertForTokenClassification.from_pretrained(folder, num_labels=3, output_loading_info=True)
    return {"missing": sorted(info["missing_keys"]),
            "head": {k: v.detach().clone().numpy() for k, v in hf.state_dict().items()
                     if k.startswith(("head.", "classifier."))},
            "mlm": {k: v.numpy() for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(f).items()}}


def _assert_started_as_transformers(run: dict, theirs: dict, name: str) -> None:
    """ModernBERT's task head as ``from_pretrained`` starts it: dense and norm transformers' (not as initialised),
    the classifier as initialised and equal to no tensor of the MLM folder."""
    import numpy as np

    assert theirs["missing"] == ["classifier.bias", "classifier.weight"], theirs["missing"]
    assert run["family"] == "modernbert" and sorted(run["loaded"]) == sorted(run["fresh"]), run["loaded"].keys()
    for key in ("head.dense.weight", "head.norm.weight"):
        np.testing.assert_array_equal(run["loaded"][key], theirs["head"][key], err_msg=f"{name} {key}")
        assert not np.array_equal(run["loaded"][key], run["fresh"][key]), (name, key)
    for key in ("head.classifier.weight", "head.classifier.bias"):
        np.testing.assert_array_equal(run["loaded"][key], run["fresh"][key], err_msg=f"{name} {key}")
        assert not any(v.shape == run["loaded"][key].shape and np.array_equal(v, run["loaded"][key])
                       for v in theirs["mlm"].values()), (name, key)


def test_finetune_from_a_modernbert_mlm_starts_its_head_as_transformers(modernbert_mlm, tmp_path):
    """transformers' ``ModernBertForTokenClassification.from_pretrained(<ModernBertForMaskedLM folder>)`` takes the MLM
    head's ``head.dense`` / ``head.norm`` (same names in both classes) and initialises only ``classifier``;
    ``finetune ner`` at step 0 starts the same way, from the HF folder and from our checkpoint of it: dense and norm
    equal transformers', the classifier as initialised (equal to no MLM tensor). A bare ``ModernBertModel`` folder
    (no MLM head) and a Megatron BERT MLM folder leave the whole task head as initialised (transformers' BERT task
    classes take nothing from the MLM head either)."""
    import numpy as np

    root, _ = modernbert_mlm
    sources = {"hf": str(root / "hf"), "ckpt": str(root / "ckpt"), "megatron_bert": str(tmp_path / "megatron_bert"),
               "bare": str(tmp_path / "bare")}
    ((res, theirs),) = run_world(1, _each_of, (_heads_at_step_zero, sources, str(tmp_path / "runs")),
                                 (_transformers_head, sources["hf"]))
    for name in ("hf", "ckpt"):
        _assert_started_as_transformers(res[name], theirs, name)
    # no MLM head in the source: transformers initialises the whole head, and so do we
    assert res["bare_missing"] == ["classifier.bias", "classifier.weight", "head.dense.weight", "head.norm.weight"]
    for name, family in (("megatron_bert", "megatron_bert"), ("bare", "modernbert")):
        run = res[name]
        assert run["family"] == family and run["loaded"] and sorted(run["loaded"]) == sorted(run["fresh"]), run
        for key, value in run["loaded"].items():
            np.testing.assert_array_equal(value, run["fresh"][key], err_msg=f"{name} {key}")


def _export_then_transformers(ckpt: str, out: str) -> dict:
    """``export hf`` of our pretraining checkpoint (a ``ModernBertForMaskedLM`` folder), then :func:`_transformers_head`
    of it: what transformers starts a task model from our pretraining head with."""
    from bio_megatron.formats.hf.convert import export_hf

    info = export_hf(ckpt, out)
    return {"class": info["class"], **_transformers_head(out)}


# a pretraining run + 4 + 1 forked ranks (5-10 s measured on two shared cores): a new end-to-end case, so extended; the
# imported (TP1-saved) checkpoint case runs in the default suite above, TP2xPP2 = TP1 fine-tuning in test_modernbert_parallel
@pytest.mark.extended
def test_finetune_from_our_tp2_pp2_pretraining_checkpoint_starts_its_head_as_transformers(pubmed_prefix, tmp_path):
    """Our ``tiny_modernbert`` pretrained one step at TP2 x PP2 (its MLM head saved on the last stage):
    ``finetune ner`` at step 0 from it, at TP1 and at TP2 x PP2 (the head on the last stage), has the head dense and
    norm that transformers' ``ModernBertForTokenClassification.from_pretrained`` takes from its ``export hf``, and
    the classifier as initialised."""
    from engine.pretrain_runs import overrides
    from layouts import pretrain_rank

    recipe = ROOT / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml"
    runs = run_world(4, pretrain_rank, recipe, overrides(pubmed_prefix, tmp_path, "tp2pp2", tp=2, pp=2, steps=1,
                                                         save_last=True))
    assert all(r["status"] == "finished" for r in runs), runs
    ckpt = str(tmp_path / "tp2pp2" / "checkpoints")
    (theirs,) = run_world(1, _export_then_transformers, ckpt, str(tmp_path / "hf"))
    assert theirs["class"] == "ModernBertForMaskedLM", theirs["class"]
    (tp1,) = run_world(1, _heads_at_step_zero, {"tp1": ckpt}, str(tmp_path / "ft"))
    last_stage = [r for r in run_world(4, _heads_at_step_zero, {"tp2pp2": ckpt}, str(tmp_path / "ft"),
                                       "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=2")
                  if r is not None]
    assert len(last_stage) == 2, last_stage  # the last stage's two TP ranks
    for name, run in [("tp1", tp1["tp1"]), *(("tp2pp2", r["tp2pp2"]) for r in last_stage)]:
        _assert_started_as_transformers(run, theirs, name)
