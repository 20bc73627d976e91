"""The word-lexicon baseline that real-data NER fine-tuning tests must beat: each training word's most frequent
tag (an unseen word: O), scored with conlleval on the same held-out sentences as the model."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path


def lexicon_f1(data: Path, n_train: int, n_test: int, split: str = "test.tsv") -> float:
    """Entity F1 of the most-frequent-tag-per-word tagger built from the first ``n_train`` sentences of
    ``data/train.tsv``, on the first ``n_test`` sentences of ``data/split``."""
    from bio_megatron.evaluation.conlleval import evaluate_lines
    from bio_megatron.tasks.ner_data import read_iob

    seen: dict[str, Counter] = defaultdict(Counter)
    for s in read_iob(data / "train.tsv")[:n_train]:
        for w, t in zip(s.words, s.tags):
            seen[w][t] += 1
    lines = []
    for s in read_iob(data / split)[:n_test]:
        lines += [f"{w} {t} {seen[w].most_common(1)[0][0] if w in seen else 'O'}" for w, t in zip(s.words, s.tags)]
        lines.append("")
    return evaluate_lines(lines)["f1"]
