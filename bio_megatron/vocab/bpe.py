"""Byte-level BPE vocabularies (RoBERTa / bio-lm: ``vocab.json`` + ``merges.txt``) and the one tokenizer factory.

Both tokenizer kinds expose the same interface (``tokenize_batch``, ``vocab_size``, ``cls``/``sep``/``pad``/
``mask``/``unk``, ``unique_identifiers``, ``lowercase``), so corpus tokenization, pretraining and the HF
converters take whatever :func:`load_tokenizer` returns instead of branching on the kind. RoBERTa's special
tokens play BERT's roles: ``<s>`` is ``cls``, ``</s>`` is ``sep`` (also the document separator), ``<pad>``,
``<unk>``, ``<mask>``; ids 0..3 and the last id for ``<mask>``, exactly as ``roberta-base``.

Fine-tuning encodes as ``RobertaTokenizerFast``: raw text (RE, QA) without a prefix space, pre-split NER words
with one (``add_prefix_space=True``), pairs as ``<s> a </s></s> b </s>`` with one token type, pad id 1.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import RustBackedTokenizer

BPE_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3; "<mask>" takes the last id
MASK = "<mask>"


def bpe_files(path: str | Path) -> tuple[Path, Path] | None:
    """``(vocab.json, merges.txt)`` when ``path`` is a BPE folder or its ``vocab.json``; else None."""
    path = Path(path)
    vocab = path / "vocab.json" if path.is_dir() else path
    if vocab.suffix != ".json" or not vocab.is_file() or vocab.name == "tokenizer.json":  # one-file: tokenizer_json
        return None
    merges = vocab.parent / "merges.txt"
    if not merges.is_file():
        raise DataError("byte-level BPE vocabulary without merges.txt beside it", str(vocab))
    return vocab, merges


def is_bpe(path: str | Path | None) -> bool:
    return path is not None and bpe_files(path) is not None


def check_merges(merges_file: str, vocab: dict[str, int]) -> None:
    """``merges.txt`` must agree with ``vocab.json``: each line (after an optional ``#version`` header) two tokens
    separated by one space, both and their concatenation in the vocabulary. The Rust tokenizer would otherwise
    fail on first use, deep in a worker, or (a merge whose result is missing) encode to ids that were never
    trained; the message names the file, the line and the token."""
    try:
        lines = Path(merges_file).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 ({exc.reason} at byte {exc.start})", merges_file) from None
    for n, line in enumerate(lines, 1):
        if (n == 1 and line.startswith("#version")) or (not line and n == len(lines)):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise DataError(f"bad merges line {line[:60]!r}: expected two tokens separated by one space", merges_file, n)
        for tok in (*parts, parts[0] + parts[1]):
            if tok not in vocab:
                raise DataError(f"merge {parts[0]!r} + {parts[1]!r} uses or produces {tok!r}, which is not in "
                                "vocab.json beside it: vocab.json and merges.txt are not from the same vocabulary",
                                merges_file, n)


class BPETokenizer(RustBackedTokenizer):
    """RoBERTa's byte-level BPE (``add_prefix_space=False``, as ``RobertaTokenizer``) with megatron-core's
    tokenizer attributes. Never lower-cases: byte-level BPE is cased by construction."""

    lowercase = False

    def __init__(self, path: str | Path):
        files = bpe_files(path)
        if files is None:
            raise DataError("not a byte-level BPE vocabulary (expected a folder with vocab.json + merges.txt, "
                            "or the vocab.json itself)", str(path))
        self.vocab_file, self.merges_file = (str(f) for f in files)
        try:
            self.vocab: dict[str, int] = json.loads(Path(self.vocab_file).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"unreadable vocab.json ({exc})", self.vocab_file) from None
        missing = [t for t in (*BPE_SPECIALS, MASK) if t not in self.vocab]
        if missing:
            raise DataError(f"BPE vocabulary lacks RoBERTa special token(s) {', '.join(missing)}", self.vocab_file)
        if not isinstance(self.vocab, dict) or not all(isinstance(i, int) for i in self.vocab.values()):
            raise DataError("vocab.json must be one JSON object of token -> integer id", self.vocab_file)
        if sorted(self.vocab.values()) != list(range(len(self.vocab))):
            raise DataError("vocab.json ids are not 0..N-1 without gaps", self.vocab_file)
        check_merges(self.merges_file, self.vocab)

    cls = property(lambda self: self.vocab["<s>"])
    sep = property(lambda self: self.vocab["</s>"])
    pad = property(lambda self: self.vocab["<pad>"])
    unk = property(lambda self: self.vocab["<unk>"])
    mask = property(lambda self: self.vocab[MASK])
    bos, eos = cls, sep

    @property
    def special_tokens_dict(self) -> dict[str, int]:
        return {"pad_token": self.pad, "unk_token": self.unk, "cls_token": self.cls,
                "sep_token": self.sep, "mask_token": self.mask}

    @cached_property
    def unique_identifiers(self) -> dict[str, str | bool]:
        """Keys megatron-core hashes into its dataset cache names: a changed vocabulary must not reuse them."""
        import hashlib

        h = hashlib.sha256(Path(self.vocab_file).read_bytes() + Path(self.merges_file).read_bytes())
        return {"class": type(self).__name__, "vocab_sha256": h.hexdigest()[:16], "lowercase": False}

    def _byte_level(self, add_prefix_space: bool):
        """The Rust tokenizer ``RobertaTokenizerFast`` builds: byte-level BPE, and its post-processor, whose
        ``trim_offsets`` keeps the leading space out of a token's character offsets (QA answers are cut with
        them); it adds ``<s>``/``</s>`` only when asked, so ids without special tokens are unchanged."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

        tok = Tokenizer(models.BPE.from_file(self.vocab_file, self.merges_file))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.RobertaProcessing(("</s>", self.sep), ("<s>", self.cls), trim_offsets=True,
                                                          add_prefix_space=add_prefix_space)
        return tok

    @cached_property
    def backend(self):
        """Raw text as ``RobertaTokenizerFast`` (``add_prefix_space=False``), built lazily so that pickling to
        worker processes stays cheap."""
        return self._byte_level(add_prefix_space=False)

    @cached_property
    def word_backend(self):
        """Pre-split words as ``RobertaTokenizerFast(add_prefix_space=True)`` encodes them (transformers requires
        it with ``is_split_into_words``): every word, the first too, in its leading-space form (``Ġword``)."""
        return self._byte_level(add_prefix_space=True)

    def pair(self, first: list[int], second: list[int]) -> tuple[list[int], list[int]]:
        """RoBERTa's pair ``<s> a </s></s> b </s>``, one token type (as ``RobertaProcessing``)."""
        ids = [self.cls, *first, self.sep, self.sep, *second, self.sep]
        return ids, [0] * len(ids)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]


def load_tokenizer(path: str | Path, lowercase: bool | None = None):
    """A :class:`BPETokenizer` for a BPE folder / ``vocab.json``, a ``tokenizer.json`` BPE model (ModernBERT's:
    :mod:`bio_megatron.vocab.tokenizer_json`), an ALBERT SentencePiece tokenizer for a ``.model``
    (:mod:`bio_megatron.vocab.sentencepiece`), else a WordPiece tokenizer over ``vocab.txt``."""
    from bio_megatron.vocab.sentencepiece import SentencePieceTokenizer, is_sentencepiece
    from bio_megatron.vocab.tokenizer_json import TokenizerJsonBPE, is_bpe_tokenizer_json
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    if is_bpe_tokenizer_json(path):  # before is_bpe: a tokenizer.json is a .json without merges.txt beside it
        return TokenizerJsonBPE(path, lowercase)
    if is_bpe(path):
        return BPETokenizer(path)
    if is_sentencepiece(path):
        return SentencePieceTokenizer(path, lowercase=lowercase)
    return WordPieceTokenizer(path, lowercase=lowercase)


def train_bpe(text_files: list[Path], out_dir: str | Path, size: int = 50_265,
              min_frequency: int = 2) -> dict[str, int]:
    """Learn a byte-level BPE vocabulary with the Rust trainer; write ``vocab.json`` + ``merges.txt`` +
    ``tokenizer.json`` into ``out_dir`` (which must exist)."""
    from tokenizers import ByteLevelBPETokenizer

    out_dir = Path(out_dir)
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    # <mask> is added after training so that it takes the last id, as in roberta-base (50264 of 50265).
    tok.train([str(f) for f in text_files], vocab_size=size - 1, min_frequency=min_frequency,
              special_tokens=list(BPE_SPECIALS), show_progress=False)
    tok.add_special_tokens([MASK])
    vocab = tok.get_vocab()  # added tokens included (model.save would leave <mask> out)
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    tok.save_model(str(out_dir))  # merges.txt (and a vocab.json we overwrite with the full one)
    (out_dir / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False) + "\n", encoding="utf-8")
    tok.save(str(out_dir / "tokenizer.json"))
    BPETokenizer(out_dir)  # the written folder must pass the checks every consumer applies
    return {"vocab_size": len(ordered), "merges": sum(1 for _ in open(out_dir / "merges.txt", encoding="utf-8")) - 1}
