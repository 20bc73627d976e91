"""The original BERT vocabularies shipped with the package, usable by name wherever a vocabulary is asked for."""

from __future__ import annotations

from pathlib import Path

VOCAB_DIR = Path(__file__).resolve().parent.parent / "resources" / "vocab"
BUILTIN = {"bert_base_cased": "bert_base_cased_vocab.txt", "bert_base_uncased": "bert_base_uncased_vocab.txt"}


def resolve_vocab(name_or_path: str | Path) -> Path:
    """The one resolution of ``model.tokenizer.vocab_file`` / ``--vocab``: ``bert-base-cased`` /
    ``bert_base_uncased`` (either spelling; an existing file of that name wins) -> the bundled ``vocab.txt``;
    anything else is returned as given, a WordPiece ``vocab.txt`` or a byte-level BPE folder / ``vocab.json``
    (:func:`bio_megatron.vocab.bpe.load_tokenizer` tells them apart and reports a missing file)."""
    key = str(name_or_path).replace("-", "_")
    if key in BUILTIN and not Path(name_or_path).exists():
        return VOCAB_DIR / BUILTIN[key]
    return Path(name_or_path)
