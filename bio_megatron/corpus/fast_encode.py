"""A faster exact WordPiece encoder for ``data tokenize``: flash-tokenizer where it is exact, ``tokenizers`` elsewhere.

Nearly all of ``data tokenize``'s time is the WordPiece encoding. `flash-tokenizer` (MIT, a C++ BERT WordPiece with
a pybind11 binding) encodes ~5x faster than ``tokenizers``' ``encode_batch_fast`` on one core, but it is not exact
on all of Unicode: measured over 259,605 texts (the bundled corpus, the NER/BLURB/ChemProt/PubMedQA/SQuAD texts in
``../shared``) with both BERT vocabularies, 13-15 texts got different ids, every one either non-ASCII (CJK
brackets ``〈f〉``, private-use characters, a soft hyphen, a BOM, ``§``, ``⁄``, combining marks) or an ASCII word
longer than ``max_input_chars_per_word`` (100; flash-tokenizer splits it where BERT gives ``[UNK]``).

So a sentence goes to flash-tokenizer only when it is printable ASCII without a 100-character run of non-space
characters; every other sentence (12 % of the bundled corpus) goes to ``tokenizers``, the reference. The result is
exact by construction on the part that the fallback covers and by measurement on the rest
(``tests/corpus/test_fast_encode.py`` compares the ids with ``tokenizers``' on every text above); on the bundled
corpus the encoding is 3.7x faster. Without the package (not x86-64 Linux, or ``--encoder tokenizers``)
everything goes to ``tokenizers``.
"""

from __future__ import annotations

import re
from typing import Protocol

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

ENCODERS = ("auto", "tokenizers")
# A whitespace-free run this long may hold a pre-token over BERT's 100-character limit (conservative: the run
# may still split at punctuation, which only sends a few more sentences to the reference).
_LONG_RUN = re.compile(r"\S{100,}")


class _BatchTokenizer(Protocol):
    vocab_file: object
    lowercase: bool

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]: ...


def flash_safe(text: str) -> bool:
    """Whether flash-tokenizer's ids are the reference's for ``text`` (see the module docstring)."""
    return text.isascii() and text.isprintable() and _LONG_RUN.search(text) is None


class HybridEncoder:
    """``tokenize_batch`` with flash-tokenizer for the ASCII sentences, the reference tokenizer for the rest."""

    def __init__(self, tokenizer: _BatchTokenizer, flash) -> None:
        self.tokenizer = tokenizer
        self._flash = flash

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(texts)
        rest: list[int] = []
        encode = self._flash.encode
        for i, text in enumerate(texts):
            if flash_safe(text):
                out[i] = encode(text, "longest", -1)[1:-1]  # it always adds [CLS] ... [SEP]
            else:
                rest.append(i)
        if rest:
            for i, ids in zip(rest, self.tokenizer.tokenize_batch([texts[i] for i in rest])):
                out[i] = ids
        return out  # type: ignore[return-value]


def _flash_class(tokenizer, encoder: str):
    """flash-tokenizer's class when it should be used for ``tokenizer``, else None."""
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, not {encoder!r}")
    if encoder == "tokenizers" or type(tokenizer) is not WordPieceTokenizer:
        return None
    try:
        from flash_tokenizer._core import FlashBertTokenizer
    except ImportError:  # not installed (only x86-64 Linux wheels exist): the reference alone
        return None
    return FlashBertTokenizer


def encoder_name(tokenizer, encoder: str = "auto") -> str:
    """What :func:`fast_encoder` will use, for summaries and logs."""
    return "flash-tokenizer (ASCII) + tokenizers" if _flash_class(tokenizer, encoder) else "tokenizers"


def fast_encoder(tokenizer, encoder: str = "auto"):
    """The tokenizer itself, or a :class:`HybridEncoder` over it when ``encoder`` is auto, the vocabulary is
    WordPiece and flash-tokenizer is importable."""
    FlashBertTokenizer = _flash_class(tokenizer, encoder)
    if FlashBertTokenizer is None:
        return tokenizer
    # No length limit (10**9): truncation is not ours to do here; tokenize_chinese_chars as BERT.
    flash = FlashBertTokenizer(str(tokenizer.vocab_file), bool(tokenizer.lowercase), 10**9, True)
    return HybridEncoder(tokenizer, flash)
