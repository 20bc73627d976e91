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

from bio_megatron.corpus.iob import read_iob
from bio_megatron.utils.errors import DataError
from bio_megatron.vocab.bpe import load_tokenizer


def _rates(pieces: list[list[int]], tok) -> dict[str, float]:
    n = max(len(pieces), 1)
    return {"words": len(pieces),
            "tokens_per_word": round(sum(len(p) for p in pieces) / n, 4),
            "whole_word_coverage": round(sum(len(p) == 1 and p[0] != tok.unk for p in pieces) / n, 4),
            "unk_rate": round(sum(tok.unk in p for p in pieces) / n, 6)}


def vocab_stats(vocab: str | Path, ner_files: list[str | Path], lowercase: bool | None = None) -> dict[str, Any]:
    """Per NER file: sub-tokens per entity word (Table 3), the same over all words, and coverage. A byte-level
    BPE vocabulary counts each word's pieces as NER fine-tuning sees them (its leading-space form)."""
    tok = load_tokenizer(vocab, lowercase)
    report: dict[str, Any] = {"vocab": str(vocab), "vocab_size": tok.vocab_size, "lowercase": tok.lowercase,
                              "files": {}}
    for path in ner_files:
        pairs = [(w, t) for s in read_iob(path) for w, t in zip(s.words, s.tags)]
        if not pairs:
            raise DataError("no tokens found (empty NER file?)", str(path))
        pieces = [e.ids for e in tok.encode_words([[w] for w, _ in pairs])]
        entity = [p for p, (_, tag) in zip(pieces, pairs) if tag != "O"]
        report["files"][str(path)] = {"entity_words": _rates(entity, tok), "all_words": _rates(pieces, tok)}
    return report
