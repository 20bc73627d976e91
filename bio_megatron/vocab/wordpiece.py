"""WordPiece vocabularies (BERT ``vocab.txt``) and the tokenizer every part of the project shares.

The tokenizer is backed by Hugging Face ``tokenizers`` (Rust, batch-encoded) and exposes the attributes
megatron-core's BERT datasets read (``cls``, ``sep``, ``mask``, ``pad``, ``inv_vocab``,
``special_tokens_dict``), so one object serves corpus tokenization and pretraining.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def read_vocab(path: str | Path) -> list[str]:
    """Read a WordPiece ``vocab.txt`` (one token per line, id = line number) and check it is usable for BERT."""
    path = check_input_file(path, "vocabulary file", empty=None,
                            missing="vocabulary file not found (expected a WordPiece vocab.txt, one token per line)")
    try:
        tokens = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DataError(f"not UTF-8 ({exc.reason} at byte {exc.start})", str(path), line) from None
    if tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise DataError("empty vocabulary", str(path))
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(
            f"vocabulary lacks BERT special token(s) {', '.join(missing)}; a WordPiece vocab.txt needs "
            f"{', '.join(SPECIAL_TOKENS)}", str(path))
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in seen:
            raise DataError(f"duplicate token {tok!r} (also on line {seen[tok] + 1})", str(path), i + 1)
        seen[tok] = i
    return tokens


def guess_lowercase(tokens: list[str]) -> bool:
    """An uncased vocabulary has (almost) no upper-case word pieces."""
    words = [t for t in tokens if not t.startswith("[") and t.isalpha()]
    upper = sum(1 for t in words if t.lower() != t)
    return upper < 0.01 * max(1, len(words))


class RustBackedTokenizer:
    """What both vocabulary kinds (WordPiece here, byte-level BPE in :mod:`bio_megatron.vocab.bpe`) do through
    their Rust ``tokenizers`` backend; a subclass builds ``backend`` (a lazy ``cached_property``).

    The fine-tuning tasks read text only through :meth:`encode_words` (NER), :meth:`encode_texts` (RE, QA),
    :meth:`single` / :meth:`pair` and ``pad``, so that each kind formats its inputs as its transformers
    tokenizer does (``BertTokenizerFast`` / ``RobertaTokenizerFast``) without the tasks branching on the kind."""

    backend: object
    vocab: dict[str, int]
    cls: int
    sep: int
    unk: int
    # Fine-tuning text encoded here warns when more than this share of its tokens is the unknown token (a
    # vocabulary that does not fit the text: another one than the model's, or the casing). data tokenize
    # turns this off in its workers: it stops on its own --max-unk-rate instead.
    warn_unknown_rate: float | None = 0.05
    # Above this share (most of the text) nothing a model learns or predicts from it means anything: stop.
    stop_unknown_rate: float = 0.5

    @property
    def vocab_size(self) -> int:
        """megatron-core's tokenizer interface, from ``vocab`` (token -> id, ids 0..N-1)."""
        return len(self.vocab)

    @cached_property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    def _check_unknown(self, id_lists: list, what: str) -> None:
        """Warn about a high unknown-token rate, or stop (:class:`DataError`) when most tokens are unknown; judged
        once per call, when at least 1,000 tokens were encoded."""
        if self.warn_unknown_rate is None:
            return
        total = sum(len(ids) for ids in id_lists)
        if total < 1000:
            return
        unk = self.unk
        unknown = sum(ids.count(unk) for ids in id_lists)
        if unknown > self.stop_unknown_rate * total:
            raise DataError(f"{100 * unknown / total:.1f}% of the {total} tokens of the {what} are the unknown token "
                            f"(lower_case={getattr(self, 'lowercase', '?')}): this vocabulary does not fit the text "
                            "(another model's vocabulary, or the wrong casing)", str(getattr(self, "vocab_file", "?")))
        if unknown > self.warn_unknown_rate * total:
            log.warning("%.1f%% of the %d tokens of the %s are the unknown token (vocabulary %s, lower_case=%s): "
                        "does this vocabulary belong to the model and the text?", 100 * unknown / total, total, what,
                        getattr(self, "vocab_file", "?"), getattr(self, "lowercase", "?"))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for lazy in ("backend", "word_backend"):
            state.pop(lazy, None)  # rebuilt lazily: pickling to worker processes stays cheap
        return state

    @property
    def word_backend(self):
        """The Rust tokenizer for pre-split words (``backend`` itself unless a kind encodes words differently)."""
        return self.backend

    def encode_words(self, sentences: list[list[str]]) -> list:
        """``tokenizers`` encodings (``ids``, ``word_ids``) of pre-split sentences, without special tokens: what
        transformers' fast tokenizer gives with ``is_split_into_words=True``."""
        out = self.word_backend.encode_batch(sentences, is_pretokenized=True, add_special_tokens=False)
        self._check_unknown([e.ids for e in out], "pre-split words")
        return out

    def encode_texts(self, texts: list[str]) -> list:
        """``tokenizers`` encodings (``ids``, character ``offsets``) of raw texts, without special tokens."""
        out = self.backend.encode_batch(texts, add_special_tokens=False)
        self._check_unknown([e.ids for e in out], "texts")
        return out

    def single(self, ids: list[int]) -> list[int]:
        """One sequence as the model reads it: ``[CLS] ids [SEP]`` (``<s> ids </s>`` for RoBERTa)."""
        return [self.cls, *ids, self.sep]

    def pair(self, first: list[int], second: list[int]) -> tuple[list[int], list[int]]:
        """Token ids and token types of a pair: BERT's ``[CLS] a [SEP] b [SEP]``, types 0 up to the first
        ``[SEP]``, 1 after. The second sequence always sits just before the last token."""
        return [self.cls, *first, self.sep, *second, self.sep], [0] * (len(first) + 2) + [1] * (len(second) + 1)

    @property
    def pair_specials(self) -> int:
        """How many special tokens :meth:`pair` adds (3 for BERT, 4 for RoBERTa)."""
        return len(self.pair([], [])[0])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast skips character offsets we never use: ~1.5x faster, same ids.
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        out = [e.ids for e in encode(texts, add_special_tokens=False)]
        self._check_unknown(out, "texts")
        return out

    def tokens_of(self, text: str) -> list[str]:
        return self.backend.encode(text, add_special_tokens=False).tokens

    def detokenize(self, ids) -> str:
        return self.backend.decode(list(map(int, ids)))


class WordPieceTokenizer(RustBackedTokenizer):
    """BERT WordPiece tokenizer over a ``vocab.txt``, with megatron-core's tokenizer attributes."""

    def __init__(self, vocab_file: str | Path, lowercase: bool | None = None):
        self.vocab_file = str(vocab_file)
        self.tokens = read_vocab(vocab_file)
        self.lowercase = guess_lowercase(self.tokens) if lowercase is None else lowercase
        self.vocab = {t: i for i, t in enumerate(self.tokens)}

    # --- megatron-core tokenizer interface -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @cached_property
    def inv_vocab(self) -> dict[int, str]:
        return dict(enumerate(self.tokens))

    @property
    def cls(self) -> int:
        return self.vocab["[CLS]"]

    @property
    def sep(self) -> int:
        return self.vocab["[SEP]"]

    @property
    def mask(self) -> int:
        return self.vocab["[MASK]"]

    @property
    def pad(self) -> int:
        return self.vocab["[PAD]"]

    @property
    def unk(self) -> int:
        return self.vocab["[UNK]"]

    @cached_property
    def unique_identifiers(self) -> dict[str, str | bool]:
        """Keys megatron-core hashes into its dataset cache names: a changed vocabulary must not reuse them."""
        import hashlib

        digest = hashlib.sha256("\n".join(self.tokens).encode("utf-8")).hexdigest()[:16]
        return {"class": type(self).__name__, "vocab_sha256": digest, "lowercase": self.lowercase}

    @property
    def special_tokens_dict(self) -> dict[str, int]:
        return {"pad_token": self.pad, "unk_token": self.unk, "cls_token": self.cls,
                "sep_token": self.sep, "mask_token": self.mask}

    # --- encoding ---------------------------------------------------------------------------------
    @cached_property
    def backend(self):
        """The Rust WordPiece tokenizer (built lazily so that pickling to worker processes is cheap)."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

        tok = Tokenizer(models.WordPiece(self.vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=self.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        return tok

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]

