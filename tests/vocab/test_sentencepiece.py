"""ALBERT's SentencePiece vocabulary: `vocab train --type sentencepiece`, the tokenizer against transformers'
AlbertTokenizer and the sentencepiece library (the outside truths) on real fixture text, `data tokenize` with the
.model, a tiny pretraining run taking it through NeMo's keys, and one-line refusals of bad files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import unicodedata
from pathlib import Path

import pytest

from reliability.cli_log import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Real text the vocabulary was not trained on: the corpus gold sentences and BC5CDR NER words.
EXTRA = ["Naïve ``quoted'' text  with   spaces, café and Ångström units (β-agonist 2.5 μg).",
         "IL-2 and TNF-α levels in HIV-1 patients: 12.5% vs. 3.1%, p<0.001.",
         "A [MASK] token and [CLS] / [SEP] in text."]


def _sentences() -> list[str]:
    """The corpus fixture's gold sentences (real PubMed/PMC text) and their paragraphs, then odd cases."""
    gold = json.loads((FIXTURES / "corpus" / "sentence_gold.json").read_text(encoding="utf-8"))
    return [s for doc in gold for s in (*doc["gold"], doc["text"])] + EXTRA


def _ner_sentences() -> list[list[str]]:
    sents, cur = [], []
    for line in (FIXTURES / "ner" / "bc5cdr_chem_devel_head.tsv").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if cur:
                sents.append(cur)
            cur = []
        else:
            cur.append(line.split("\t")[0])
    return sents + ([cur] if cur else [])


@pytest.fixture(scope="module")
def jsonl(pubmed_prefix) -> list[Path]:
    data = Path(pubmed_prefix).parent
    return [data / "pubmed.jsonl", data / "pmc.jsonl"]


def _train(jsonl, out: Path, *flags: str) -> Path:
    rc, msg = run_cli(["vocab", "train", "--type", "sentencepiece", "--size", "2000", *flags,
                       "--input", *map(str, jsonl), "--output", str(out)])
    assert rc == 0, msg
    return out


@pytest.fixture(scope="module")
def spiece(jsonl, tmp_path_factory) -> Path:
    return _train(jsonl, tmp_path_factory.mktemp("spiece") / "spiece.model")


@pytest.fixture(scope="module")
def spiece_cased(jsonl, tmp_path_factory) -> Path:
    return _train(jsonl, tmp_path_factory.mktemp("spiece_cased") / "cased.model", "--cased")


def _albert(model: Path, lower: bool, tmp: Path):
    from transformers import AlbertTokenizer

    tmp.mkdir()
    shutil.copyfile(model, tmp / "spiece.model")  # the name AlbertTokenizer.from_pretrained reads
    return AlbertTokenizer.from_pretrained(str(tmp), do_lower_case=lower)


def test_special_pieces_and_trainer_as_albert(spiece):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.sentencepiece import SentencePieceTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(spiece))
    assert [sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, -1, -1)
    assert all(sp.is_control(i) for i in (2, 3, 4)) and sp.get_piece_size() == 2000
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spiece.read_bytes())
    assert proto.trainer_spec.model_type == proto.trainer_spec.UNIGRAM
    assert proto.normalizer_spec.name == "nmt_nfkc"
    assert not any(p.piece != p.piece.lower() for p in proto.pieces if p.type == p.NORMAL)  # lower-cased text
    tok = load_tokenizer(spiece)
    assert isinstance(tok, SentencePieceTokenizer) and tok.lowercase is True
    assert (tok.pad, tok.unk, tok.cls, tok.sep, tok.mask, tok.vocab_size) == (0, 1, 2, 3, 4, 2000)
    assert tok.special_tokens_dict == {"pad_token": 0, "unk_token": 1, "cls_token": 2, "sep_token": 3,
                                       "mask_token": 4}


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_tokenization_equals_albert_tokenizer_and_sentencepiece(cased, spiece, spiece_cased, tmp_path):
    """Ids, character offsets, NER word ids and pairs as transformers' AlbertTokenizer gives them on the same
    spiece.model; ids also as the sentencepiece library gives them after ALBERT's text preparation."""
    import sentencepiece as spm

    from bio_megatron.vocab.bpe import load_tokenizer

    model = spiece_cased if cased else spiece
    tok = load_tokenizer(model)
    assert tok.lowercase is (not cased)
    hf = _albert(model, not cased, tmp_path / "hf")
    texts, words = _sentences(), _ner_sentences()
    assert len(texts) > 20 and len(words) > 20

    ours = tok.encode_texts(texts)
    ref = hf(texts, add_special_tokens=False, return_offsets_mapping=True)
    assert [e.ids for e in ours] == ref["input_ids"]
    assert [[tuple(o) for o in e.offsets] for e in ours] == [[tuple(o) for o in r] for r in ref["offset_mapping"]]
    assert sum(e.ids.count(tok.unk) for e in ours) < sum(len(e.ids) for e in ours) // 20

    sp = spm.SentencePieceProcessor(model_file=str(model))

    def albert_prepared(text: str) -> str:  # ALBERT's own preprocess_text: quotes, accents, lower-casing
        text = unicodedata.normalize("NFKD", text.replace("``", '"').replace("''", '"'))
        text = "".join(c for c in text if not unicodedata.combining(c))
        return text if cased else text.lower()

    plain = texts[:-1]  # the last one holds literal [MASK]/[CLS]: matched whole by transformers, not by spm
    assert tok.tokenize_batch(plain) == [sp.encode(albert_prepared(t)) for t in plain]

    enc = tok.encode_words(words)
    ref_w = hf(words, is_split_into_words=True, add_special_tokens=False)
    assert [e.ids for e in enc] == ref_w["input_ids"]
    assert [e.word_ids for e in enc] == [ref_w.word_ids(i) for i in range(len(words))]

    a, b = tok.tokenize(texts[0]), tok.tokenize(texts[1])
    ids, types = tok.pair(a, b)
    pair = hf(texts[0], texts[1], return_token_type_ids=True)
    assert (ids, types) == (pair["input_ids"], pair["token_type_ids"])
    assert tok.single(a) == hf(texts[0])["input_ids"]
    assert tok.detokenize(a) == hf.decode(a)


def test_hf_tokenizer_files_round_trip(spiece_cased, tmp_path):
    """What export hf writes for the tokenizer (spiece.model + transformers' files) loads back in transformers
    as the same tokenizer, casing included."""
    from transformers import AlbertTokenizer

    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.sentencepiece import save_sentencepiece, sentencepiece_files

    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "albert"}')  # export writes the model's files first
    written = save_sentencepiece(out, spiece_cased, lowercase=False)
    assert "spiece.model" in written and (out / "spiece.model").read_bytes() == spiece_cased.read_bytes()
    assert "config.json" not in written and "tokenizer_config.json" in written
    assert sentencepiece_files(out) == [out / "spiece.model"]
    hf = AlbertTokenizer.from_pretrained(str(out))
    tok = load_tokenizer(out)  # an ALBERT folder is a SentencePiece vocabulary too
    texts = _sentences()
    assert hf(texts, add_special_tokens=False)["input_ids"] == tok.tokenize_batch(texts)
    assert tok.lowercase is False and hf.do_lower_case is False


@pytest.fixture(scope="module")
def tokenized(spiece, jsonl, tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("sp_data") / "corpus"
    rc, msg = run_cli(["data", "tokenize", "--input", *map(str, jsonl), "--vocab", str(spiece),
                       "--output-prefix", str(prefix), "--workers", "1"])
    assert rc == 0, msg
    return prefix


def test_data_tokenize_records_the_model(tokenized, spiece, jsonl):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from bio_megatron.vocab.sentencepiece import SentencePieceTokenizer

    rec = json.loads(Path(f"{tokenized}.bio_megatron.json").read_text())["vocab"]
    assert rec["kind"] == "sentencepiece" and rec["sha256"] == hashlib.sha256(spiece.read_bytes()).hexdigest()
    assert rec["lowercase"] is True and rec["vocab_size"] == 2000
    sentences = [s for f in jsonl for line in f.read_text().splitlines() if line.strip()
                 for s in json.loads(line)["sentences"] if s.strip()]
    expected = [i for ids in SentencePieceTokenizer(spiece).tokenize_batch(sentences) for i in ids]
    ds = IndexedDataset(str(tokenized))
    got = [i for k in range(len(ds)) for i in ds[k].tolist()]
    assert len(got) > 10_000 and got == expected


NEMO_KEYS = ("model.tokenizer.library=sentencepiece",)


@pytest.fixture(scope="module")
def pretrained(tokenized, spiece, tmp_path_factory) -> Path:
    """A tiny pretraining run given the model in NeMo's spelling (library: sentencepiece, tokenizer_model)."""
    from engine.pretrain_runs import losses, overrides, pretrain_rank
    from harness import run_world

    root = tmp_path_factory.mktemp("sp_run")
    extra = (*NEMO_KEYS, f"model.tokenizer.tokenizer_model={spiece}")
    assert run_world(1, pretrain_rank, overrides(tokenized, root, "sp", steps=2, save_last=True,
                                                 extra=extra)) == ["finished"]
    assert len(losses(root / "sp")) == 2
    return root / "sp" / "checkpoints" / "iter_0000002"


def test_pretraining_checkpoint_carries_the_model(pretrained, spiece, tmp_path):
    """The checkpoint holds the model as spiece.model (no vocab.txt), and a resume compares it by content."""
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.resume_checks import vocab_mismatch

    assert (pretrained / "spiece.model").read_bytes() == spiece.read_bytes()
    assert not (pretrained / "vocab.txt").exists()
    other = tmp_path / "other.model"
    other.write_bytes(spiece.read_bytes() + b"\n")
    assert vocab_mismatch(pretrained, spiece) is None and "differs in content" in vocab_mismatch(pretrained, other)
    cfg = load_pretrain_config(Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny.yaml",
                               [*NEMO_KEYS, f"model.tokenizer.model={spiece}"])
    assert cfg.model.tokenizer.vocab_file == str(spiece)  # Megatron's spelling of the key maps the same way


def test_finetuning_from_the_checkpoint_reads_its_model(pretrained, tmp_path):
    """Fine-tuning restored from that checkpoint tokenizes with its spiece.model (NER words, real fixture)."""
    from bio_megatron.formats.source import resolve_source
    from bio_megatron.vocab.bpe import load_tokenizer
    from bio_megatron.vocab.sentencepiece import SentencePieceTokenizer

    data = Path(__file__).resolve().parents[1] / "fixtures" / "finetune"
    over = [f"model.restore_from_path={pretrained}", f"model.dataset.data_dir={data}",
            "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path}"]
    rc, msg = run_cli(["finetune", "ner", "--config", "tiny_ner", "--dry-run", *over])
    assert rc == 0, msg
    src = resolve_source(pretrained)  # what fine-tuning, predict and export read the vocabulary from
    tokenizer = load_tokenizer(src.vocab_file)
    assert isinstance(tokenizer, SentencePieceTokenizer)
    assert Path(tokenizer.vocab_file) == pretrained / "spiece.model" and tokenizer.lowercase is True


def _make_models(tmp: Path, jsonl) -> dict[str, Path]:
    """Files that are not an ALBERT SentencePiece model: text, a truncated model, BPE, no [MASK]."""
    import sentencepiece as spm

    text = tmp / "train.txt"
    text.write_text("\n".join(s for f in jsonl for line in f.read_text().splitlines()[:30]
                              for s in json.loads(line)["sentences"]) + "\n")
    for name, kw in (("bpe", {"model_type": "bpe"}), ("plain", {})):
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp / name), vocab_size=300,
                                       minloglevel=2, num_threads=1, **kw)
    (tmp / "text.model").write_text("the\nof\nand\n")
    good = (tmp / "plain.model").read_bytes()
    (tmp / "cut.model").write_bytes(good[: len(good) // 3])
    return {"text": tmp / "text.model", "cut": tmp / "cut.model", "bpe": tmp / "bpe.model",
            "no_specials": tmp / "plain.model", "missing": tmp / "absent.model"}


EXPECT = {"text": "not a SentencePiece model", "cut": "not a SentencePiece model", "bpe": "of type bpe",
          "no_specials": "lacks ALBERT's special piece(s) <pad>, [CLS], [SEP], [MASK]",
          "missing": "SentencePiece model not found"}


def test_bad_model_files_are_one_line_exit_2(jsonl, tmp_path):
    models = _make_models(tmp_path, jsonl)
    for kind, model in models.items():
        before = sorted(os.listdir(tmp_path))
        prefix = tmp_path / f"out_{kind}"
        rc, msg = run_cli(["data", "tokenize", "--input", str(jsonl[0]), "--vocab", str(model),
                           "--output-prefix", str(prefix), "--workers", "1"])
        assert rc == 2 and EXPECT[kind] in msg and str(model) in msg and "\n" not in msg, (kind, msg)
        assert sorted(os.listdir(tmp_path)) == before, kind  # nothing written: no .bin/.idx/record/shards/lock
        rc, msg = run_cli(["pretrain", "--config", "tiny", "--dry-run", "model.tokenizer.library=sentencepiece",
                           f"model.tokenizer.tokenizer_model={model}",
                           f"exp_manager.exp_dir={tmp_path / 'runs'}"])
        assert rc == 2 and str(model) in msg, (kind, msg)  # the pre-flight's wording may differ: the file is named
        assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("over,expected", [
    (["model.tokenizer.library=sentencepiece"], "needs model.tokenizer.tokenizer_model=X.model"),
    (["model.tokenizer.library=sentencepiece", "model.tokenizer.tokenizer_model=vocab.txt"],
     "must be a SentencePiece .model file"),
    (["model.tokenizer.tokenizer_model=x.model"], "needs model.tokenizer.library=sentencepiece"),
    (["model.tokenizer.library=sentencepiece", "model.tokenizer.tokenizer_model=a.model",
      "model.tokenizer.model=b.model"], "name different files"),
], ids=["no_model", "not_model", "no_library", "two_models"])
def test_nemo_tokenizer_keys_are_checked(over, expected, tmp_path):
    rc, msg = run_cli(["pretrain", "--config", "tiny", "--dry-run", *over, f"exp_manager.exp_dir={tmp_path}"])
    assert rc == 2 and expected in msg, msg
    assert not any(tmp_path.iterdir())


def test_whole_word_masking_sees_albert_words(spiece):
    """megatron-core's masked dataset groups a word's pieces by WordPiece's '##': the tokenizer's inv_vocab marks
    the pieces that continue a word, so whole-word / n-gram masking masks ALBERT's words (▁ starts one)."""
    from bio_megatron.vocab.bpe import load_tokenizer

    tok = load_tokenizer(spiece)
    words = [[w for w in sent if w.isalpha()] for sent in _ner_sentences()]
    enc = tok.encode_words([w for w in words if w])
    n = 0
    for e in enc:
        for k, (i, word) in enumerate(zip(e.ids, e.word_ids)):
            continues = tok.inv_vocab[i].startswith("##")
            assert continues == (k > 0 and e.word_ids[k - 1] == word), (tok.convert_ids_to_tokens(e.ids), k)
            n += continues
    assert n > 50  # the fixture's words do split into several pieces
    assert [tok.inv_vocab[i] for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.convert_ids_to_tokens(e.ids) == [tok.tokens[i] for i in e.ids]  # the pieces themselves


def test_training_twice_gives_the_same_file(spiece, jsonl, tmp_path):
    """The same corpus gives a byte-identical spiece.model (no temporary paths inside), so the vocabulary sha256
    that data tokenize records and pretraining checks is stable across trainings."""
    again = _train(jsonl, tmp_path / "again.model")
    assert again.read_bytes() == spiece.read_bytes()


def test_pretraining_refuses_a_bad_model_before_writing(tokenized, jsonl, tmp_path):
    """A file that is not an ALBERT spiece.model stops pretraining in one line before the run folder exists."""
    from engine.pretrain_runs import overrides, pretrain_rank
    from harness import run_world

    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x0a\x05hello")  # a protobuf field, then nothing a ModelProto holds
    extra = (*NEMO_KEYS, f"model.tokenizer.tokenizer_model={bad}")
    with pytest.raises(RuntimeError, match="SentencePiece model"):
        run_world(1, pretrain_rank, overrides(tokenized, tmp_path / "runs", "bad", extra=extra))
    assert not (tmp_path / "runs").exists()
