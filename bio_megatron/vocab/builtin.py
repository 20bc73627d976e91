"""The original BERT vocabularies shipped with the package, usable by name wherever a vocab.txt is asked for."""

from __future__ import annotations

from pathlib import Path

VOCAB_DIR = Path(__file__).resolve().parent.parent / "resources" / "vocab"
BUILTIN = {"bert_base_cased": "bert_base_cased_vocab.txt", "bert_base_uncased": "bert_base_uncased_vocab.txt"}


def resolve_vocab(name_or_path: str | Path) -> Path:
    """``bert-base-cased`` / ``bert_base_uncased`` (either spelling) -> the bundled file; else the path as given."""
    key = str(name_or_path).replace("-", "_")
    if key in BUILTIN and not Path(name_or_path).exists():
        return VOCAB_DIR / BUILTIN[key]
    return Path(name_or_path)
