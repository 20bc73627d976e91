"""SentencePiece unigram vocabularies as ALBERT uses them (``spiece.model``), and their tokenizer.

ALBERT (Lan et al. 2020; BioM-ALBERT) tokenizes with a SentencePiece *unigram* model whose first pieces are
``<pad>`` (0), ``<unk>`` (1), ``[CLS]`` (2), ``[SEP]`` (3) and ``[MASK]`` (4), as in ALBERT's published
``spiece.model``. The text is prepared the way ``AlbertTokenizer`` prepares it before the model sees it:
two back-ticks and two apostrophes become a double quote, accents are stripped (NFKD, combining marks dropped),
the text is lower-cased for an uncased model, then the model's own normalisation (its precompiled ``nmt_nfkc``
map) applies and every whitespace-separated word starts with ``▁``.

The encoding runs in the Rust ``tokenizers`` library (a :class:`tokenizers.models.Unigram` over the model's
pieces and scores), so that this tokenizer has exactly the interface of the WordPiece and BPE ones
(:class:`~bio_megatron.vocab.wordpiece.RustBackedTokenizer`: batches, character offsets, word ids for NER) and
gives the ids transformers' ``AlbertTokenizer`` gives on the same ``spiece.model``
(``tests/vocab/test_sentencepiece.py`` checks both that and the ``sentencepiece`` library's own encoding).
"""

from __future__ import annotations

import hashlib
import shutil
from functools import cached_property
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.vocab.wordpiece import RustBackedTokenizer, guess_lowercase

SPIECE_SPECIALS = ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4, as ALBERT's published spiece.model
SPIECE_NAME = "spiece.model"  # the file name transformers' AlbertTokenizer looks for in a folder
_WORD_START = "\u2581"  # SentencePiece's "▁"
_UNIGRAM = 1  # TrainerSpec.ModelType: UNIGRAM=1, BPE=2, WORD=3, CHAR=4
_UNKNOWN, _CONTROL = 2, 3  # ModelProto.SentencePiece.Type


def spiece_file(path: str | Path | None) -> Path | None:
    """The ``.model`` file when ``path`` is a SentencePiece model (a ``.model`` file, or a folder holding
    ``spiece.model`` and no WordPiece/BPE vocabulary); else None."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        if (path / "vocab.txt").is_file() or (path / "vocab.json").is_file():
            return None
        return path / SPIECE_NAME if (path / SPIECE_NAME).is_file() else None
    return path if path.suffix == ".model" else None


def is_sentencepiece(path: str | Path | None) -> bool:
    return spiece_file(path) is not None


def sentencepiece_files(path: str | Path) -> list[Path]:
    """The files a SentencePiece vocabulary is made of (one: the ``.model``), for checkpoints and HF folders."""
    model = spiece_file(path)
    if model is None:
        raise DataError(f"not a SentencePiece model (expected a .model file or a folder with {SPIECE_NAME})",
                        str(path))
    return [model]


def read_model(path: str | Path):
    """Parse and check a SentencePiece ``.model`` (a ``ModelProto``): unigram, with ALBERT's special pieces."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    path = check_input_file(path, "SentencePiece model", empty=None,
                            missing="SentencePiece model not found (expected an ALBERT-style spiece.model)")
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except (DecodeError, ValueError) as exc:  # protobuf reports a truncated or foreign file either way
        raise DataError(f"not a SentencePiece model ({exc or 'unparsable protobuf'}); expected an ALBERT-style "
                        "spiece.model from `bio-megatron vocab train --type sentencepiece`", str(path)) from None
    pieces = [p.piece for p in proto.pieces]
    if not pieces or not all(pieces):
        raise DataError("not a SentencePiece model (no pieces, or an empty piece); expected an ALBERT-style "
                        "spiece.model", str(path))
    if proto.trainer_spec.model_type != _UNIGRAM:
        kind = {2: "bpe", 3: "word", 4: "char"}.get(proto.trainer_spec.model_type, str(proto.trainer_spec.model_type))
        raise DataError(f"SentencePiece model of type {kind}: ALBERT's tokenizer is a unigram model "
                        "(train one with `bio-megatron vocab train --type sentencepiece`)", str(path))
    missing = [t for t in SPIECE_SPECIALS if t not in pieces]
    if missing:
        raise DataError(f"SentencePiece model lacks ALBERT's special piece(s) {', '.join(missing)} "
                        f"(expected {', '.join(SPIECE_SPECIALS)})", str(path))
    if len(set(pieces)) != len(pieces):
        raise DataError("SentencePiece model has duplicate pieces", str(path))
    if proto.pieces[pieces.index("<unk>")].type != _UNKNOWN:
        raise DataError("SentencePiece model's <unk> is not its unknown piece", str(path))
    return proto


class SentencePieceTokenizer(RustBackedTokenizer):
    """ALBERT's SentencePiece tokenizer over a ``spiece.model``, with megatron-core's tokenizer attributes.

    ``lowercase=None`` follows the model: one trained on lower-cased text (no upper-case pieces) lower-cases."""

    def __init__(self, path: str | Path, lowercase: bool | None = None):
        model = spiece_file(path)
        if model is None:
            raise DataError(f"not a SentencePiece model (expected a .model file or a folder with {SPIECE_NAME})",
                            str(path))
        self.vocab_file = str(model)
        proto = read_model(model)
        self.tokens = [p.piece for p in proto.pieces]
        self.scores = [float(p.score) for p in proto.pieces]
        self.precompiled_charsmap = bytes(proto.normalizer_spec.precompiled_charsmap)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.lowercase = (guess_lowercase([t.replace(_WORD_START, "") for t in self.tokens])
                          if lowercase is None else bool(lowercase))

    # --- megatron-core tokenizer interface -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @cached_property
    def inv_vocab(self) -> dict[int, str]:
        """id -> piece as megatron-core's masked dataset reads it: it takes a ``##`` prefix for a piece that
        continues a word (WordPiece's convention), so a SentencePiece piece that continues a word -- one without
        ``▁`` that holds a letter or digit -- is shown as ``##piece``. Whole-word and n-gram masking then group
        pieces into ALBERT's words (``▁`` starts one; specials and punctuation stand alone) instead of masking every
        piece on its own. :meth:`convert_ids_to_tokens` gives the pieces themselves."""
        return {i: "##" + t if self._continues(i, t) else t for i, t in enumerate(self.tokens)}

    def _continues(self, i: int, piece: str) -> bool:
        return (i not in self._special_ids and not piece.startswith(_WORD_START)
                and any(c.isalnum() for c in piece))

    @cached_property
    def _special_ids(self) -> set[int]:
        return {self.vocab[t] for t in SPIECE_SPECIALS}

    cls = property(lambda self: self.vocab["[CLS]"])
    sep = property(lambda self: self.vocab["[SEP]"])
    pad = property(lambda self: self.vocab["<pad>"])
    unk = property(lambda self: self.vocab["<unk>"])
    mask = property(lambda self: self.vocab["[MASK]"])
    bos, eos = cls, sep

    @property
    def special_tokens_dict(self) -> dict[str, int]:
        return {"pad_token": self.pad, "unk_token": self.unk, "cls_token": self.cls,
                "sep_token": self.sep, "mask_token": self.mask}

    @cached_property
    def unique_identifiers(self) -> dict[str, str | bool]:
        """Keys megatron-core hashes into its dataset cache names: a changed model must not reuse them."""
        digest = hashlib.sha256(Path(self.vocab_file).read_bytes()).hexdigest()[:16]
        return {"class": type(self).__name__, "vocab_sha256": digest, "lowercase": self.lowercase}

    # --- encoding ---------------------------------------------------------------------------------
    @cached_property
    def backend(self):
        """The Rust unigram tokenizer, with ALBERT's text preparation in front of the model's own normaliser
        (``AlbertTokenizer``'s ``do_lower_case``, ``keep_accents=False``); built lazily so that pickling to
        worker processes stays cheap."""
        from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import Unigram

        tok = Tokenizer(Unigram(list(zip(self.tokens, self.scores)), unk_id=self.unk, byte_fallback=False))
        steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"'),
                 normalizers.NFKD(), normalizers.StripAccents()]
        if self.lowercase:
            steps.append(normalizers.Lowercase())
        if self.precompiled_charsmap:
            steps.append(normalizers.Precompiled(self.precompiled_charsmap))
        tok.normalizer = normalizers.Sequence(steps)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=_WORD_START, prepend_scheme="always")])
        tok.decoder = decoders.Metaspace(replacement=_WORD_START, prepend_scheme="always")
        # The specials are matched whole in the raw text (never split into pieces), as in AlbertTokenizer.
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPIECE_SPECIALS])
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls), ("[SEP]", self.sep)])
        return tok

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]


def save_sentencepiece(out: str | Path, model_file: str | Path, lowercase: bool) -> list[str]:
    """Write the tokenizer files of an ALBERT Hugging Face folder into ``out`` (which must exist): the
    ``spiece.model`` itself plus transformers' ``tokenizer.json`` / ``tokenizer_config.json`` (``do_lower_case``
    recorded, so ``AlbertTokenizer.from_pretrained(out)`` tokenizes as this project did). Returns the names
    written."""
    import tempfile

    from transformers import AlbertTokenizer

    out = Path(out)
    read_model(model_file)  # a bad file is refused before anything is written
    before = {p.name for p in out.iterdir()}
    # Converted from a folder holding only the model: files already in ``out`` (config.json, ...) play no part.
    with tempfile.TemporaryDirectory(prefix="bio-megatron-spiece-") as tmp:
        shutil.copyfile(model_file, Path(tmp) / SPIECE_NAME)
        tok = AlbertTokenizer.from_pretrained(tmp, do_lower_case=lowercase)
    tok.save_pretrained(str(out))
    shutil.copyfile(model_file, out / SPIECE_NAME)  # the model itself, byte for byte (what import hf reads)
    return sorted({p.name for p in out.iterdir()} - before)
