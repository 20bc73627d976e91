"""Fine-tuning from RoBERTa (byte-level BPE) models, against transformers as the outside truth.

Tokenization: NER words, RE sentences and QA question/context pairs of the real task slices are encoded and
padded exactly as ``RobertaTokenizerFast`` built from the same ``vocab.json``/``merges.txt`` encodes them
(``add_prefix_space=True`` for pre-split NER words; pad id 1; one token type; QA offsets). Models: a random tiny
``RobertaForMaskedLM`` -> ``import hf`` -> ``finetune ner`` (the loss falls) -> ``predict ner`` and ``export hf``
-> ``RobertaForTokenClassification`` with our logits; our own tiny RoBERTa pretraining checkpoint -> ``finetune
re`` -> ``RobertaForSequenceClassification`` (RoBERTa's dense/tanh/out_proj head) with our logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from finetune.ft_runs import RECIPES, ROOT, finetune_rank
from harness import run_world

from engine.pretrain_runs import overrides

NER_DEV = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_devel_head.tsv"
SEQ = 64  # the HF model's positions (ours; transformers' table has padding_idx + 1 more rows)
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")  # IndexedDataset outside a world


@pytest.fixture(scope="module")
def bpe_dir(pubmed_prefix, tmp_path_factory) -> Path:
    """A byte-level BPE vocabulary learned by ``vocab train --type bpe`` from the bundled PubMed/PMC corpus."""
    from bio_megatron.vocab.train import train_bpe_vocab

    data = Path(pubmed_prefix).parent
    out = tmp_path_factory.mktemp("roberta_ft_bpe") / "bpe"
    train_bpe_vocab([data / "pubmed.jsonl", data / "pmc.jsonl"], out, size=1000)
    return out


@pytest.fixture(scope="module")
def roberta_classes() -> None:
    """transformers' RoBERTa model classes imported once in this process: each forked world then has them."""
    import transformers

    for name in ("RobertaForMaskedLM", "RobertaForTokenClassification", "RobertaForSequenceClassification"):
        getattr(transformers, name)


def _hf_tokenizer(folder: Path, add_prefix_space: bool = False):
    from transformers import RobertaTokenizerFast

    return RobertaTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                                add_prefix_space=add_prefix_space)


def _config(task: str, *over: str):
    from bio_megatron.config.finetune import load_finetune_config

    return load_finetune_config(task, RECIPES[task], [f"model.dataset.data_dir={ROOT / _data_dir(task)}",
                                                      "model.dataset.test_file=null", *over], 1)


def _data_dir(task: str) -> str:
    return {"ner": "tests/fixtures/finetune", "re": "tests/fixtures/re", "qa": "tests/fixtures/qa"}[task]


# --- tokenization -----------------------------------------------------------------------------------------------
def test_ner_words_and_batches_equal_roberta_tokenizer_fast(bpe_dir):
    from bio_megatron.tasks.ner import NerTask
    from bio_megatron.tasks.ner_data import IGNORE_INDEX
    from bio_megatron.vocab.bpe import load_tokenizer

    tok, hf = load_tokenizer(bpe_dir), _hf_tokenizer(bpe_dir, add_prefix_space=True)
    task = NerTask(_config("ner", "model.dataset.max_seq_length=48", "model.dataset.max_train_examples=16"), tok)
    split = task.split("dev")
    enc = hf([s.words for s in split.sentences], is_split_into_words=True, truncation=True, max_length=48)
    truncated = 0
    for i, (s, f) in enumerate(zip(split.sentences, split.features)):
        assert f.input_ids == enc["input_ids"][i] and f.word_ids == enc.word_ids(i)
        truncated += f.word_ids[-2] != len(s.words) - 1
        firsts = [p for p, m in enumerate(f.subtokens_mask) if m]
        assert [task.labels[f.labels[p]] for p in firsts] == s.tags[:len(firsts)]  # the word's label on its first
        assert all(f.labels[p] != IGNORE_INDEX for p, w in enumerate(f.word_ids) if w is not None)  # and the rest
    assert truncated > 0  # some sentences are longer than 48 pieces: truncation is compared too
    batch = task.collate(split, list(range(8)), 48)
    padded = hf([s.words for s in split.sentences[:8]], is_split_into_words=True, truncation=True, max_length=48,
                padding="max_length", return_tensors="pt")
    assert hf.pad_token_id == tok.pad == 1
    assert batch["input_ids"].equal(padded["input_ids"]) and batch["attention_mask"].equal(padded["attention_mask"])
    assert not batch["tokentype_ids"].any()


def test_re_sentences_equal_roberta_tokenizer_fast(bpe_dir):
    from bio_megatron.tasks.re import ReTask
    from bio_megatron.vocab.bpe import load_tokenizer

    tok, hf = load_tokenizer(bpe_dir), _hf_tokenizer(bpe_dir)
    task = ReTask(_config("re", "model.dataset.max_seq_length=40"), tok)
    text = [e.sentence for e in task.train.examples]
    enc = hf(text, truncation=True, max_length=40)
    assert task.train.features == enc["input_ids"]
    assert sum(len(f) == 40 for f in task.train.features) > 5  # truncated ones included
    batch = task.collate(task.train, list(range(len(text))), 40)
    padded = hf(text, truncation=True, max_length=40, padding="max_length", return_tensors="pt")
    assert batch["input_ids"].equal(padded["input_ids"]) and batch["attention_mask"].equal(padded["attention_mask"])


def test_qa_pairs_windows_and_offsets_equal_roberta_tokenizer_fast(bpe_dir):
    from bio_megatron.tasks.qa_data import build_features, read_squad
    from bio_megatron.vocab.bpe import load_tokenizer

    tok, hf = load_tokenizer(bpe_dir), _hf_tokenizer(bpe_dir)
    examples = read_squad(ROOT / "tests" / "fixtures" / "qa" / "squad_v2_dev_slice.json")
    whole = build_features(examples, tok, max_seq_length=2048, max_query_length=512, training=True)
    assert len(whole) == len(examples)  # one window each: the whole pair as transformers encodes it
    pairs = [hf(e.question, e.context, return_offsets_mapping=True, return_token_type_ids=True) for e in examples]
    answered = 0
    for f, e, enc in zip(whole, examples, pairs):
        offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"], enc.sequence_ids())]
        assert (f.input_ids, f.token_type_ids, f.offsets) == (enc["input_ids"], enc["token_type_ids"], offsets)
        if f.start_position:  # the target span, cut from the context with those offsets, is the answer
            assert e.context[f.offsets[f.start_position][0]:f.offsets[f.end_position][1]] == e.answers[0]["text"]
            answered += 1
    assert answered > 10
    windows = build_features(examples, tok, max_seq_length=96, doc_stride=32, max_query_length=24)
    assert len(windows) > 2 * len(examples)
    starts: dict[int, list[int]] = {}
    for f in windows:  # <s> question </s></s> a slice of transformers' context tokens and offsets </s>
        e, enc = examples[f.example_index], pairs[f.example_index]
        q = hf(e.question, add_special_tokens=False)["input_ids"][:24]
        ctx = [p for p, s in enumerate(enc.sequence_ids()) if s == 1]
        ids, offs = [enc["input_ids"][p] for p in ctx], [tuple(enc["offset_mapping"][p]) for p in ctx]
        window, n = (f.input_ids[len(q) + 3:-1], f.offsets[len(q) + 3:-1]), len(f.input_ids) - len(q) - 4
        assert len(f.input_ids) <= 96 and f.input_ids[:len(q) + 3] == [0, *q, 2, 2] and f.input_ids[-1] == 2
        assert not any(f.token_type_ids)
        starts.setdefault(f.example_index, []).append(
            next(k for k in range(len(ids)) if (ids[k:k + n], offs[k:k + n]) == window))
    assert all(k == list(range(0, 32 * len(k), 32)) for k in starts.values())  # doc_stride: the step between starts


# --- fine-tuning, prediction and export ---------------------------------------------------------------------------
def _make_hf(folder: str, bpe: str) -> None:
    import shutil

    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    out = Path(folder)
    out.mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(Path(bpe) / name, out / name)
    vocab = len(__import__("json").loads((out / "vocab.json").read_text()))
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=SEQ + 2, type_vocab_size=1, layer_norm_eps=1e-5,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, architectures=["RobertaForMaskedLM"])
    hf = RobertaForMaskedLM(cfg)
    with torch.no_grad():  # LayerNorm gains and biases too, so that no mapping hides behind 1s and 0s
        for name, p in hf.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.1)
    hf.save_pretrained(folder)


def _import(hf_dir: str, out: str) -> None:
    from bio_megatron.formats.hf.convert import import_hf

    import_hf(hf_dir, out)


def _logits_vs_transformers(ckpt: str, out: str, task: str, inputs: list) -> dict:
    """``export hf`` of a fine-tuned checkpoint, loaded by transformers, against our model on the same batch;
    for NER also ``predict ner`` on each sentence's text against the entities transformers' logits give."""
    import torch
    import transformers

    from bio_megatron.evaluation.conlleval import chunks
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.predict.ner import predict_entities

    info = export_hf(ckpt, out)
    theirs_model = getattr(transformers, info["class"]).from_pretrained(out).eval()
    loaded = load_finetuned(ckpt)
    hf = _hf_tokenizer(Path(out), add_prefix_space=task == "ner")
    enc = hf(inputs, is_split_into_words=task == "ner", padding=True, truncation=True, max_length=SEQ,
             return_tensors="pt")
    with torch.no_grad():
        ours = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
        theirs = theirs_model(**enc).logits
    res = {"class": info["class"], "labels": [theirs_model.config.id2label[i] for i in range(len(info["labels"]))]}
    if task == "re":
        return {**res, "diff": (ours - theirs).abs().max().item(), "scale": ours.abs().max().item()}
    valid = enc["attention_mask"].bool()
    res.update(diff=(ours - theirs)[valid].abs().max().item(), scale=ours[valid].abs().max().item(),
               predicted=[], expected=[])
    for i, words in enumerate(inputs):
        text = " ".join(words)
        starts = [sum(len(w) + 1 for w in words[:k]) for k in range(len(words))]
        wids = enc.word_ids(i)
        firsts = [wids.index(k) for k in range(len(words))]
        tags = [loaded.labels[int(theirs[i, p].argmax())] for p in firsts]
        res["expected"].append([(t, starts[s], starts[e - 1] + len(words[e - 1])) for t, s, e in chunks(words, tags)])
        res["predicted"].append([(x["type"], x["start"], x["end"]) for x in predict_entities(loaded, text)])
    return res


def _whole_sentences(bpe_dir: Path, sentences: list[list[str]], n: int) -> list[list[str]]:
    """The first ``n`` sentences that ``predict ner`` reads back as the same words in one piece (one sentence to
    the splitter, words as in the file, at most the model's length), so both sides see the same input."""
    from tokenizers.pre_tokenizers import BertPreTokenizer

    from bio_megatron.tasks.re_data import split_sentences

    hf, pre, out = _hf_tokenizer(bpe_dir, add_prefix_space=True), BertPreTokenizer(), []
    for words in sentences:
        text = " ".join(words)
        if (len(split_sentences(text)) == 1 and [w for w, _ in pre.pre_tokenize_str(text)] == words
                and len(hf(words, is_split_into_words=True)["input_ids"]) <= SEQ):
            out.append(words)
    return out[:n]


def _pretrain_roberta(over: list[str]) -> None:
    import os

    import torch.distributed as dist

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    recipe = ROOT / "nemo_configs" / "pretrain" / "tiny_roberta.yaml"
    run_pretraining(load_pretrain_config(recipe, over, world_size=int(os.environ["WORLD_SIZE"])))
    dist.barrier()


FT = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", f"model.dataset.max_seq_length={SEQ}",
      "model.dataset.test_file=null", "model.dataset.max_eval_examples=16"]


def test_import_hf_roberta_finetune_ner_predict_export(bpe_dir, roberta_classes, tmp_path):
    from bio_megatron.tasks.ner_data import read_iob

    run_world(1, _make_hf, str(tmp_path / "hf"), str(bpe_dir))
    run_world(1, _import, str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    steps = 24
    (res,) = run_world(1, finetune_rank, "ner", FT + [
        f"model.restore_from_path={tmp_path / 'ckpt'}", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=ner",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "model.dataset.max_train_examples=192",
        "model.dataset.class_balancing=weighted_loss"])  # weighted: a few steps already tag entities for predict
    first, last = sum(res["losses"][:4]) / 4, sum(res["losses"][-4:]) / 4
    print(f"roberta ner: mean loss steps 1-4 {first:.3f}, {steps - 3}-{steps} {last:.3f}; dev {res['dev']}")
    assert len(res["losses"]) == steps and last < first - 0.2, res["losses"]
    sentences = _whole_sentences(bpe_dir, [s.words for s in read_iob(NER_DEV)], 12)
    (out,) = run_world(1, _logits_vs_transformers, res["checkpoint"], str(tmp_path / "hf_ner"), "ner", sentences)
    print(f"RobertaForTokenClassification vs ours: max |diff| {out['diff']:.2e} (logits up to {out['scale']:.2f}); "
          f"predict ner found {sum(map(len, out['predicted']))} entities in {len(sentences)} sentences")
    assert out["class"] == "RobertaForTokenClassification" and out["labels"] == ["O", "B-Chemical", "I-Chemical"]
    assert out["scale"] > 0.5 and out["diff"] < 1e-4, out
    assert out["predicted"] == out["expected"]


def test_own_roberta_pretraining_checkpoint_finetune_re_export(bpe_dir, pubmed_prefix, roberta_classes,
                                                                tmp_path):
    from bio_megatron.corpus.tokenize import tokenize_corpus
    from bio_megatron.tasks.re_data import read_relations

    data = Path(pubmed_prefix).parent
    prefix = tmp_path / "bpe_data"
    tokenize_corpus([data / "pubmed.jsonl"], bpe_dir, prefix, workers=1)
    run_world(1, _pretrain_roberta, overrides(prefix, tmp_path, "pre", steps=2, save_last=True,
                                              extra=(f"model.tokenizer.vocab_file={bpe_dir}",)))
    ckpt = tmp_path / "pre" / "checkpoints"
    assert (next(ckpt.glob("iter_*")) / "vocab.json").is_file()
    steps = 6
    (res,) = run_world(1, finetune_rank, "re", FT + [
        f"model.restore_from_path={ckpt}", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=re",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}"])
    assert len(res["losses"]) == steps and all(x == x for x in res["losses"])
    text = [e.sentence for e in read_relations(ROOT / "tests" / "fixtures" / "re" / "chemprot_scibert_dev_head.jsonl",
                                               "scibert")[:8]]
    (out,) = run_world(1, _logits_vs_transformers, res["checkpoint"], str(tmp_path / "hf_re"), "re", text)
    print(f"RobertaForSequenceClassification vs ours: max |diff| {out['diff']:.2e} (logits up to {out['scale']:.2f})")
    assert out["class"] == "RobertaForSequenceClassification" and out["labels"][0] == "false"
    assert out["scale"] > 0.05 and out["diff"] < 1e-4, out
