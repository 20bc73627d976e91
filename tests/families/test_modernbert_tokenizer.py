"""ModernBERT's one-file BPE tokenizer: a byte-level BPE ``tokenizer.json`` trained here with the ``tokenizers`` library
on the BC5CDR-chem fixture (BERT's special tokens added after the merges, ModernBERT's ``[CLS] $A [SEP]`` template;
nothing downloaded) beside a random tiny ``ModernBertForMaskedLM`` imports with ``import hf --verify`` (no vocab.txt,
no merges.txt), splits text exactly as transformers' fast tokenizer on the folder does, fine-tunes (``finetune
ner``), predicts (``predict ner``) and exports (``export hf``: the same tokenizer.json bytes, which AutoTokenizer
loads, and ModernBertForTokenClassification with our logits); a tokenizer.json without a [MASK] token is refused
by name, exit 2, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from architectures.hf_parity import imported, masked_max_diff, perturb_norms_and_biases
from harness import run_world
from reliability.cli_log import run_cli
from reliability.files import tree_digest

from engine.pretrain_runs import losses, overrides

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_train_head.tsv"
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
TEXTS = ["Naloxone reverses the antihypertensive effect of clonidine.", "Cocaine-induced seizures in rats ; 5-HT"]


def _sentences() -> list[str]:
    words, out = [], []
    for line in TRAIN.read_text(encoding="utf-8").splitlines():
        if line.strip():
            words.append(line.split("\t")[0])
        elif words:
            out.append(" ".join(words))
            words = []
    return out + ([" ".join(words)] if words else [])


def write_tokenizer_json(path: str, specials: list[str] = SPECIALS) -> int:
    """A byte-level BPE trained on the fixture's sentences, ``specials`` added after it (as ModernBERT's are);
    the number of tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_sentences(), trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens(specials)
    if "[CLS]" in specials and "[SEP]" in specials:
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(path)
    return tok.get_vocab_size(with_added_tokens=True)


def _config(vocab: int, ids: dict, **extra):
    from transformers import ModernBertConfig

    return ModernBertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                            intermediate_size=96, max_position_embeddings=128, local_attention=8,
                            global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=50.0,
                            initializer_range=0.2, attn_implementation="eager", **ids, **extra)


def _make_mlm(folder: str, specials: list[str] = SPECIALS) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import ModernBertForMaskedLM

    Path(folder).mkdir(parents=True)
    vocab = write_tokenizer_json(f"{folder}/tokenizer.json", specials)
    t = Tokenizer.from_file(f"{folder}/tokenizer.json")
    roles = {"pad_token_id": "[PAD]", "cls_token_id": "[CLS]", "sep_token_id": "[SEP]", "bos_token_id": "[CLS]",
             "eos_token_id": "[SEP]"}
    ids = {k: t.token_to_id(v) for k, v in roles.items() if t.token_to_id(v) is not None}
    torch.manual_seed(0)
    hf = ModernBertForMaskedLM(_config(vocab, ids, architectures=["ModernBertForMaskedLM"])).eval()
    perturb_norms_and_biases(hf)
    hf.save_pretrained(folder)
    return {"vocab": vocab}


@pytest.fixture(scope="module")
def bpe_modernbert(tmp_path_factory):
    """(root, ...): the folder ``root/hf`` (weights + tokenizer.json only) imported (--verify) to ``root/ckpt``."""
    return imported(tmp_path_factory, "hf_modernbert_bpe", _make_mlm)


def _same_split(hf_dir: str, ckpt: str) -> dict:
    """Our tokenizer of the imported checkpoint vs transformers' fast tokenizer on the HF folder: ids of raw text."""
    from transformers import PreTrainedTokenizerFast

    from bio_megatron.formats.source import resolve_source
    from bio_megatron.vocab.bpe import load_tokenizer

    src = resolve_source(ckpt)
    ours = load_tokenizer(src.vocab_file)
    theirs = PreTrainedTokenizerFast(tokenizer_file=f"{hf_dir}/tokenizer.json")
    return {"file": src.vocab_file.name, "kind": type(ours).__name__, "cls": ours.cls, "mask": ours.mask,
            "ours": [ours.single(ours.tokenize(t)) for t in TEXTS],
            "theirs": [theirs(t)["input_ids"] for t in TEXTS], "vocab_size": ours.vocab_size}


def test_tokenizer_json_folder_imports_and_splits_as_transformers(bpe_modernbert):
    """import hf --verify passed on a folder with only tokenizer.json; the checkpoint keeps that file and our
    tokenizer gives transformers' ids ([CLS] ... [SEP] included)."""
    root, ref = bpe_modernbert
    assert not (root / "hf" / "vocab.txt").exists() and not (root / "hf" / "merges.txt").exists()
    (res,) = run_world(1, _same_split, str(root / "hf"), str(root / "ckpt"))
    assert res["file"] == "tokenizer.json" and res["kind"] == "TokenizerJsonBPE", res
    assert res["vocab_size"] == ref["vocab"] and res["cls"] == ref["vocab"] - 4, res
    assert res["ours"] == res["theirs"] and len(res["ours"][0]) > 8, res
    assert (root / "ckpt" / "tokenizer.json").read_bytes() == (root / "hf" / "tokenizer.json").read_bytes()


def _finetune_ner(over: list[str]) -> list[float]:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import run_finetuning

    os.chdir(ROOT)
    res = run_finetuning(load_finetune_config("ner", ROOT / "nemo_configs" / "ner" / "tiny_ner.yaml", over, 1))
    return [h["loss"] for h in res["history"] if "loss" in h]


def _predict_and_export(ckpt: str, text_file: str, pred: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from bio_megatron.cli import main
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned

    rc = main(["predict", "ner", "--checkpoint", ckpt, "--input", text_file, "--out", pred])
    info = export_hf(ckpt, out)
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    loaded = load_finetuned(ckpt)
    hf = AutoModelForTokenClassification.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
        theirs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    valid = enc["attention_mask"].bool()
    ours_ids = [loaded.tokenizer.single(loaded.tokenizer.tokenize(t)) for t in TEXTS]
    return {"predict_rc": rc, "class": info["class"], "same_ids": ours_ids == tok(TEXTS)["input_ids"],
            "diff": masked_max_diff(ours, theirs, valid), "scale": float(ours[valid].abs().max())}


def test_finetune_predict_and_export_keep_the_tokenizer_json(bpe_modernbert, tmp_path):
    """finetune ner (3 steps) from the import, predict ner on two lines, export hf: tokenizer.json byte-identical
    to the original, AutoTokenizer on the export splits as ours, ModernBertForTokenClassification gives our
    logits."""
    root, _ = bpe_modernbert
    over = ["trainer.max_steps=3", "trainer.val_check_interval=3", "model.dataset.max_eval_examples=8",
            "model.dataset.test_file=null", "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=ner", f"model.restore_from_path={root / 'ckpt'}"]
    (losses,) = run_world(1, _finetune_ner, over)
    assert len(losses) == 3 and all(0.0 < v < 10.0 for v in losses), losses
    text = tmp_path / "docs.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (res,) = run_world(1, _predict_and_export, str(tmp_path / "ner" / "checkpoints"), str(text),
                       str(tmp_path / "pred.jsonl"), str(tmp_path / "hf"))
    assert res["predict_rc"] == 0 and len((tmp_path / "pred.jsonl").read_text().splitlines()) == 2, res
    assert res["class"] == "ModernBertForTokenClassification" and res["same_ids"], res
    assert res["scale"] > 0.01 and res["diff"] < 1e-4, res
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (root / "hf" / "tokenizer.json").read_bytes()
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["mask_token"] == "[MASK]"


def _make_without_mask(folder: str) -> dict:
    return _make_mlm(folder, [s for s in SPECIALS if s != "[MASK]"])


def test_tokenizer_json_without_a_mask_token_is_refused_by_name(tmp_path):
    """A tokenizer.json lacking [MASK]: import hf exits 2 with one line naming the file and the token; nothing at
    --out, the folder unchanged."""
    run_world(1, _make_without_mask, str(tmp_path / "hf"))
    before = tree_digest(tmp_path / "hf")
    rc, text = run_cli(["import", "hf", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "out")], sep="\n")
    assert rc == 2 and len(text.splitlines()) == 1, text
    assert "tokenizer.json" in text and "[MASK]" in text, text
    assert not (tmp_path / "out").exists() and tree_digest(tmp_path / "hf") == before


def _tokenize_and_continue(ckpt: str, jsonl: str, root: str) -> dict:
    """``data tokenize --vocab <ckpt>/tokenizer.json``, then ``pretrain --config tiny_modernbert`` continuing the
    imported weights (``model.restore_from_path``) on packed MLM rows of that data, 3 steps."""
    import torch.distributed as dist

    from bio_megatron.cli import main
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    prefix = f"{root}/data/pubmed_bpe"
    rc = main(["data", "tokenize", "--input", jsonl, "--vocab", f"{ckpt}/tokenizer.json", "--output-prefix", prefix])
    shape = ["model.num_layers=3", "model.hidden_size=64", "model.num_attention_heads=4", "model.ffn_hidden_size=96",
             "model.max_position_embeddings=128", "model.local_attention=8", "model.global_attn_every_n_layers=2",
             "model.global_rope_theta=1000.0", "model.local_rope_theta=50.0", "model.layernorm_epsilon=1e-5"]
    over = overrides(Path(prefix), Path(root), "continue", steps=3, save_last=True) + shape + [
        f"model.restore_from_path={ckpt}", f"model.tokenizer.vocab_file={ckpt}/tokenizer.json",
        "model.objective=mlm", "model.data.masking=token", "model.data.packing=documents",
        "model.encoder_seq_length=64"]
    cfg = load_pretrain_config(ROOT / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml", over, 1)
    status = run_pretraining(cfg)
    dist.barrier()
    return {"tokenize_rc": rc, "status": status}


def test_continued_pretraining_on_data_tokenized_with_the_tokenizer_json(bpe_modernbert, pubmed_prefix, tmp_path):
    """The imported ModernBERT's tokenizer.json tokenizes the bundled PubMed text (``data tokenize``) and pretraining
    continues the imported weights on it (model.objective mlm: its [PAD] is not id 0; packed documents); the
    checkpoints keep the tokenizer.json."""
    root, _ = bpe_modernbert
    (res,) = run_world(1, _tokenize_and_continue, str(root / "ckpt"), str(Path(pubmed_prefix).parent / "pubmed.jsonl"),
                       str(tmp_path))
    assert res["tokenize_rc"] == 0 and res["status"] == "finished", res
    run = losses(tmp_path / "continue")
    assert sorted(run) == [1, 2, 3] and all(0.0 < v < 10.0 for v in run.values()), run
    saved = list((tmp_path / "continue" / "checkpoints").rglob("tokenizer.json"))
    assert saved and saved[0].read_bytes() == (root / "hf" / "tokenizer.json").read_bytes()
