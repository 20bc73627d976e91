"""How well a vocabulary fits a domain: the paper's Table 3 figure and coverage, on an IOB2 NER file.

Table 3 of BioMegatron reports, over the words inside named entities of a training set, the number
of WordPiece sub-tokens per word (BERT-cased 3.012 on BC5CDR-chem, 1.478 for the bio 50k vocab):
the fewer pieces an entity breaks into, the better the model can represent it. We report that
figure, the same over all words, and coverage (the share of words that are one whole vocabulary
token, and the share that become ``[UNK]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.wordpiece import WordPieceTokenizer


def read_iob(path: str | Path) -> list[tuple[str, str]]:
    """(word, tag) pairs of a ``token<TAB>tag`` IOB2 file (blank lines between sentences are dropped)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("NER file not found", str(path))
    pairs: list[tuple[str, str]] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DataError(f"not UTF-8 ({exc.reason} at byte {exc.start} of the line)", str(path), lineno) from None
            if not line.strip() or line.startswith("-DOCSTART-"):
                continue
            parts = line.split("\t") if "\t" in line else line.split()
            if len(parts) < 2:
                raise DataError(f"expected 'token<TAB>tag', got {line[:60]!r}", str(path), lineno)
            tag = parts[-1]
            if tag != "O" and not tag[:2] in ("B-", "I-") and tag not in ("B", "I"):
                raise DataError(f"tag {tag!r} is not IOB2 (O, B-*, I-*)", str(path), lineno)
            pairs.append((parts[0], tag))
    if not pairs:
        raise DataError("no tokens found (empty NER file?)", str(path))
    return pairs


def _rates(pieces: list[list[int]], tok: WordPieceTokenizer) -> dict[str, float]:
    n = max(len(pieces), 1)
    return {"words": len(pieces),
            "tokens_per_word": round(sum(len(p) for p in pieces) / n, 4),
            "whole_word_coverage": round(sum(len(p) == 1 and p[0] != tok.unk for p in pieces) / n, 4),
            "unk_rate": round(sum(tok.unk in p for p in pieces) / n, 6)}


def vocab_stats(vocab: str | Path, ner_files: list[str | Path], lowercase: bool | None = None) -> dict[str, Any]:
    """Per NER file: sub-tokens per entity word (Table 3), the same over all words, and coverage."""
    tok = WordPieceTokenizer(vocab, lowercase=lowercase)
    report: dict[str, Any] = {"vocab": str(vocab), "vocab_size": tok.vocab_size, "lowercase": tok.lowercase,
                              "files": {}}
    for path in ner_files:
        pairs = read_iob(path)
        words = [w for w, _ in pairs]
        pieces = tok.tokenize_batch(words)
        entity = [p for p, (_, tag) in zip(pieces, pairs) if tag != "O"]
        report["files"][str(path)] = {"entity_words": _rates(entity, tok), "all_words": _rates(pieces, tok)}
    return report
