"""Learn a domain vocabulary with SentencePiece and write it as a BERT WordPiece ``vocab.txt``.

BioMegatron's bio vocabularies were learned with SentencePiece on PubMed, but megatron-core's BERT
datasets need WordPiece semantics: a word-initial piece is a plain token and a continuation carries
``##`` (whole-word masking relies on exactly that). So we:

1. normalise and pre-tokenize the training text exactly as the WordPiece tokenizer will at encode time
   (BERT normaliser + BERT pre-tokenizer: whitespace and punctuation splits, optional lower-casing),
   so SentencePiece only ever learns pieces *within* the words WordPiece will see;
2. train SentencePiece (BPE by default) with a whitespace-split, dummy-prefix setup, where ``▁x``
   marks a word start;
3. convert: ``▁piece`` -> ``piece``, ``piece`` -> ``##piece``; prepend BERT's special tokens and every
   character of the training alphabet in both forms so that no seen word becomes ``[UNK]``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bio_megatron.corpus.schema import ReadStats, iter_documents
from bio_megatron.corpus.xmlio import Progress
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.wordpiece import SPECIAL_TOKENS, read_vocab

log = get_logger(__name__)
_WORD_START = "\u2581"  # SentencePiece's "▁"


def _normalizer(lowercase: bool):
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                      lowercase=lowercase)
    return norm, pre_tokenizers.BertPreTokenizer()


def write_training_text(inputs: list[Path], out: Path, lowercase: bool, max_sentences: int | None,
                        raw: bool = False, prepare: Any = None) -> dict[str, int]:
    """One pre-tokenized sentence a line (``raw``: the sentence as is, for byte-level BPE, which sees the
    text exactly as ``data tokenize`` will give it; ``prepare``: a ``tokenizers`` normaliser applied to the raw
    sentence, for SentencePiece); returns counts."""
    norm, pre = _normalizer(lowercase)
    if prepare is not None:
        raw = True
    stats = ReadStats()
    n = 0
    progress = Progress("vocab training sentences")
    with open(out, "w", encoding="utf-8") as fh:
        for path in inputs:
            for _, doc in iter_documents(path, stats):
                for sent in doc["sentences"]:
                    if raw:
                        if prepare is not None:
                            sent = prepare.normalize_str(sent)
                        if sent.strip():
                            fh.write(sent.replace("\n", " ") + "\n")
                            n += 1
                        continue
                    words = [w for w, _ in pre.pre_tokenize_str(norm.normalize_str(sent))]
                    if words:
                        fh.write(" ".join(words) + "\n")
                        n += 1
                progress.update(1)
                if max_sentences and n >= max_sentences:
                    break
            if max_sentences and n >= max_sentences:
                break
    if n == 0:
        raise DataError("no sentences to learn a vocabulary from", ", ".join(map(str, inputs)))
    return {"documents": stats.documents, "sentences": n, "skipped_records": stats.skipped}


def sentencepiece_to_wordpiece(pieces: list[str], alphabet: set[str], size: int) -> list[str]:
    """BERT vocab.txt order: specials, alphabet (both forms), then pieces in SentencePiece's order."""
    vocab: dict[str, None] = dict.fromkeys(SPECIAL_TOKENS)
    for ch in sorted(alphabet):
        vocab.setdefault(ch)
        vocab.setdefault("##" + ch)
    for piece in pieces:
        if piece.startswith("<") and piece.endswith(">"):
            continue  # SentencePiece's own control symbols (<unk>, <s>, </s>)
        token = piece[1:] if piece.startswith(_WORD_START) else "##" + piece
        if token and token != "##" and not token.startswith("##" + _WORD_START):
            vocab.setdefault(token)
    tokens = list(vocab)
    if len(tokens) > size:
        tokens = tokens[:size]  # SentencePiece orders pieces by usefulness: the tail is the least useful
    return tokens


def train_bpe_vocab(inputs: list[str | Path] | str | Path, output: str | Path, size: int = 50_265,
                    max_sentences: int | None = 5_000_000, overwrite: bool = False) -> dict[str, Any]:
    """Learn a RoBERTa byte-level BPE vocabulary (bio-lm: 50k) into the folder ``output`` (atomically):
    ``vocab.json`` + ``merges.txt`` + ``tokenizer.json``."""
    from bio_megatron.vocab.bpe import BPE_SPECIALS, train_bpe
    from bio_megatron.utils.io import atomic_path

    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if size < 300:  # 256 byte symbols + the specials must fit
        raise DataError(f"BPE vocabulary size {size} is too small (at least 300: 256 bytes + specials)")
    with tempfile.TemporaryDirectory(prefix="bio-megatron-bpe-") as tmp:
        text = Path(tmp) / "train.txt"
        counts = write_training_text(paths, text, False, max_sentences, raw=True)
        with atomic_path(output, command="vocab train", overwrite=overwrite) as out:
            out.mkdir()
            made = train_bpe([text], out, size)
    if made["vocab_size"] < size:
        log.warning("the corpus only supports %d tokens (asked for %d): train on more text for a full "
                    "vocabulary", made["vocab_size"], size)
    summary = {**counts, **made, "requested_size": size, "type": "bpe", "specials": [*BPE_SPECIALS, "<mask>"],
               "output": str(output)}
    log.info("byte-level BPE vocabulary: %d tokens, %d merges from %d sentences -> %s", made["vocab_size"],
             made["merges"], counts["sentences"], output)
    return summary


def train_vocab(inputs: list[str | Path] | str | Path, output: str | Path, size: int = 30000,
                lowercase: bool = False, model_type: str = "bpe", max_sentences: int | None = 5_000_000,
                character_coverage: float = 0.9999, threads: int = 1, seed_sentencepiece: bool = True
                ) -> dict[str, Any]:
    """Train a ``size``-token WordPiece vocabulary from JSONL documents; write ``output`` atomically."""
    import sentencepiece as spm

    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if size < 100:
        raise DataError(f"vocabulary size {size} is too small (at least 100)")
    with tempfile.TemporaryDirectory(prefix="bio-megatron-vocab-") as tmp:
        text = Path(tmp) / "train.txt"
        counts = write_training_text(paths, text, lowercase, max_sentences)
        alphabet = {c for line in open(text, encoding="utf-8") for c in line if not c.isspace()}
        # SentencePiece counts its own alphabet and control symbols inside vocab_size; ask for the
        # target minus what we add back (specials + '##' copies of characters), then trim to size.
        sp_size = max(size - len(SPECIAL_TOKENS) - len(alphabet), len(alphabet) + 10)
        prefix = str(Path(tmp) / "sp")
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=prefix, vocab_size=sp_size, model_type=model_type,
            character_coverage=character_coverage, hard_vocab_limit=False,  # a small corpus gives fewer
            split_by_whitespace=True, add_dummy_prefix=True, normalization_rule_name="identity",
            remove_extra_whitespaces=True, bos_id=-1, eos_id=-1, unk_id=0, byte_fallback=False,
            max_sentence_length=1 << 16, num_threads=max(1, threads), minloglevel=2,
            input_sentence_size=max_sentences or 0, shuffle_input_sentence=False)
        pieces = [line.split("\t", 1)[0] for line in open(prefix + ".vocab", encoding="utf-8")]
    tokens = sentencepiece_to_wordpiece(pieces, alphabet, size)
    if len(tokens) < size:
        log.warning("the corpus only supports %d tokens (asked for %d): train on more text for a full "
                    "vocabulary", len(tokens), size)
    with atomic_open(output, "w", encoding="utf-8") as fh:
        fh.write("\n".join(tokens) + "\n")
    read_vocab(output)  # the written file must pass the same checks every consumer applies
    summary = {**counts, "vocab_size": len(tokens), "requested_size": size, "lowercase": lowercase,
               "model_type": model_type, "alphabet": len(alphabet),
               "continuations": sum(t.startswith("##") for t in tokens), "output": str(output)}
    log.info("vocabulary: %d tokens (%d '##' continuations) from %d sentences -> %s", len(tokens),
             summary["continuations"], counts["sentences"], output)
    return summary



def train_sentencepiece_vocab(inputs: list[str | Path] | str | Path, output: str | Path, size: int = 30_000,
                              lowercase: bool = True, max_sentences: int | None = 5_000_000,
                              character_coverage: float = 0.99995, threads: int = 1) -> dict[str, Any]:
    """Learn an ALBERT-style SentencePiece unigram model (``spiece.model``) from JSONL documents; write
    ``output`` atomically.

    As ALBERT's published model: unigram, ``<pad>`` 0, ``<unk>`` 1, then ``[CLS]`` ``[SEP]`` ``[MASK]`` as
    control pieces (2..4; never produced from text), no BOS/EOS pieces, the ``nmt_nfkc`` normalisation, and
    (``lowercase``) lower-cased text. The training text is prepared as the tokenizer prepares text at encode
    time (``vocab/sentencepiece.py``: quotes, accents stripped, lower-casing), so the pieces are learned from
    what ``data tokenize`` will show the model. ALBERT's README also makes a few punctuation marks user-defined
    pieces; they are left out here because transformers' ``AlbertTokenizer`` splits text at user-defined pieces
    before the model (the ``sentencepiece`` library does not), so the two would disagree on most sentences."""
    import sentencepiece as spm
    from tokenizers import normalizers

    from bio_megatron.vocab.sentencepiece import SPIECE_SPECIALS, SentencePieceTokenizer

    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if size < 100:
        raise DataError(f"SentencePiece vocabulary size {size} is too small (at least 100)")
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'), normalizers.NFKD(),
             normalizers.StripAccents()]
    prepare = normalizers.Sequence(steps + [normalizers.Lowercase()] if lowercase else steps)
    with tempfile.TemporaryDirectory(prefix="bio-megatron-spiece-") as tmp:
        text = Path(tmp) / "train.txt"
        counts = write_training_text(paths, text, lowercase, max_sentences, prepare=prepare)
        prefix = str(Path(tmp) / "spiece")
        spm.set_random_generator_seed(1234)  # the same corpus gives the same model (sampling, shuffling)
        try:
            spm.SentencePieceTrainer.train(
                input=str(text), model_prefix=prefix, vocab_size=size, model_type="unigram",
                pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, control_symbols=list(SPIECE_SPECIALS[2:]),
                normalization_rule_name="nmt_nfkc", character_coverage=character_coverage,
                hard_vocab_limit=False,  # a small corpus gives fewer pieces than asked for: warned below
                max_sentence_length=1 << 16, num_threads=max(1, threads), minloglevel=2,
                input_sentence_size=max_sentences or 0, shuffle_input_sentence=True)
        except RuntimeError as exc:  # e.g. a corpus too small for even the characters it holds
            raise DataError(f"SentencePiece could not learn a vocabulary: {exc}",
                            ", ".join(map(str, paths))) from None
        model = _reproducible(Path(prefix + ".model").read_bytes())
    with atomic_open(output, "wb") as fh:
        fh.write(model)
    tok = SentencePieceTokenizer(output, lowercase=lowercase)  # the written file must pass every consumer's checks
    if tok.vocab_size < size:
        log.warning("the corpus only supports %d pieces (asked for %d): train on more text for a full "
                    "vocabulary", tok.vocab_size, size)
    summary = {**counts, "vocab_size": tok.vocab_size, "requested_size": size, "type": "sentencepiece",
               "model_type": "unigram", "lowercase": lowercase, "specials": list(SPIECE_SPECIALS),
               "output": str(output)}
    log.info("SentencePiece unigram model: %d pieces (%s) from %d sentences -> %s", tok.vocab_size,
             "lower-cased" if lowercase else "cased", counts["sentences"], output)
    return summary


def _reproducible(model: bytes) -> bytes:
    """The trained model without the temporary paths its trainer spec records (input file, model prefix): the same
    corpus then gives a byte-identical ``spiece.model``, so vocabulary fingerprints (``data tokenize`` records,
    checkpoints) agree across two trainings."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    del proto.trainer_spec.input[:]
    proto.trainer_spec.model_prefix = "spiece"
    return proto.SerializeToString()
