"""NER data: IOB ``token<TAB>tag`` files, NeMo ``text_*.txt``/``labels_*.txt``, label maps, sub-word alignment.

Label ids follow NeMo: the ``pad_label`` (``O``) is id 0 and the other labels follow in sorted order;
the map is saved as ``label_ids.csv`` (one label per line, the line number is the id).

Sub-word labels (paper Figure 1) come in two schemes:
``ignore_extra_tokens=False``: every sub-token carries its word's label;
``ignore_extra_tokens=True``: only the first sub-token is labelled, the rest get ``IGNORE_INDEX``.
``ignore_start_end`` masks [CLS]/[SEP] out of the loss. Predictions are per word, read at the
word's first sub-token (:func:`word_predictions`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index
_TAG_RE = re.compile(r"^(O|[BIES](-\S+)?)$")


@dataclass
class Sentence:
    """One sentence: words and their word-level tags (same length)."""

    words: list[str]
    tags: list[str]


def _check_tag(tag: str, path: str | None, line: int | None, labels: set[str] | None) -> None:
    if labels is not None:
        if tag not in labels:
            raise DataError(f"unknown tag {tag!r}; known tags: {sorted(labels)}", path, line)
    elif not _TAG_RE.match(tag):
        raise DataError(f"unknown tag {tag!r}; expected O, B-<type> or I-<type> (IOB2)", path, line)


def read_iob(path: str | Path, labels: Iterable[str] | None = None) -> list[Sentence]:
    """Read an IOB file: ``token<TAB>tag`` per line, blank line between sentences.

    ``labels`` restricts the allowed tags (e.g. a saved label map); otherwise any IOB/IOBES-shaped tag
    is accepted. Wrong field counts and unknown tags raise :class:`DataError` with the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError("IOB file not found (expected 'token<TAB>tag' lines)", str(path))
    allowed = set(labels) if labels is not None else None
    sentences, words, tags = [], [], []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                if words:
                    sentences.append(Sentence(words, tags))
                words, tags = [], []
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0]:
                raise DataError(f"expected 'token<TAB>tag', got {len(fields)} tab-separated field(s): {line!r}",
                                str(path), lineno)
            _check_tag(fields[1], str(path), lineno, allowed)
            words.append(fields[0])
            tags.append(fields[1])
    if words:
        sentences.append(Sentence(words, tags))
    return sentences


def write_iob(path: str | Path, sentences: Sequence[Sentence]) -> None:
    """Write sentences as ``token<TAB>tag`` lines with a blank line after each sentence (atomically)."""
    with atomic_open(path, "w", encoding="utf-8") as fh:
        for s in sentences:
            fh.writelines(f"{w}\t{t}\n" for w, t in zip(s.words, s.tags))
            fh.write("\n")


def read_nemo(text_path: str | Path, labels_path: str | Path,
              labels: Iterable[str] | None = None) -> list[Sentence]:
    """Read NeMo's ``text_*.txt`` (space-separated words) with the matching ``labels_*.txt``."""
    text_path, labels_path = Path(text_path), Path(labels_path)
    for p in (text_path, labels_path):
        if not p.is_file():
            raise DataError("file not found (NeMo NER needs text_*.txt and labels_*.txt)", str(p))
    allowed = set(labels) if labels is not None else None
    texts = text_path.read_text(encoding="utf-8").splitlines()
    tag_lines = labels_path.read_text(encoding="utf-8").splitlines()
    if len(texts) != len(tag_lines):
        raise DataError(f"{len(texts)} sentences but {len(tag_lines)} label lines in {labels_path}",
                        str(text_path), min(len(texts), len(tag_lines)) + 1)
    sentences = []
    for lineno, (text, tag_line) in enumerate(zip(texts, tag_lines), 1):
        words, tags = text.split(), tag_line.split()
        if len(words) != len(tags):
            raise DataError(f"{len(words)} words but {len(tags)} labels on this line of {labels_path}",
                            str(text_path), lineno)
        for t in tags:
            _check_tag(t, str(labels_path), lineno, allowed)
        if words:
            sentences.append(Sentence(words, tags))
    return sentences


def write_nemo(text_path: str | Path, labels_path: str | Path, sentences: Sequence[Sentence]) -> None:
    """Write NeMo's pair of files: one sentence per line, words/labels separated by single spaces."""
    for i, s in enumerate(sentences):
        bad = next((w for w in s.words if not w or any(c.isspace() for c in w)), None)
        if bad is not None:
            raise DataError(f"sentence {i}: word {bad!r} is empty or contains white space, which NeMo's "
                            "space-separated text format cannot represent")
    with atomic_open(text_path, "w", encoding="utf-8") as ft, atomic_open(labels_path, "w", encoding="utf-8") as fl:
        for s in sentences:
            ft.write(" ".join(s.words) + "\n")
            fl.write(" ".join(s.tags) + "\n")


def iob_to_nemo(iob_path: str | Path, out_dir: str | Path, split: str) -> tuple[Path, Path]:
    """Convert an IOB file to ``out_dir/text_{split}.txt`` and ``out_dir/labels_{split}.txt``."""
    sentences = read_iob(iob_path)
    out_dir = Path(out_dir)
    text, labels = out_dir / f"text_{split}.txt", out_dir / f"labels_{split}.txt"
    write_nemo(text, labels, sentences)
    log.info("%s -> %s, %s: %d sentences", iob_path, text, labels, len(sentences))
    return text, labels


def nemo_to_iob(text_path: str | Path, labels_path: str | Path, out_path: str | Path) -> Path:
    """Convert NeMo's ``text_*.txt``/``labels_*.txt`` pair to one IOB ``token<TAB>tag`` file."""
    sentences = read_nemo(text_path, labels_path)
    write_iob(out_path, sentences)
    log.info("%s + %s -> %s: %d sentences", text_path, labels_path, out_path, len(sentences))
    return Path(out_path)


# --- label map ------------------------------------------------------------------------------------
def build_label_map(sentences: Iterable[Sentence], pad_label: str = "O") -> dict[str, int]:
    """NeMo's label ids: ``pad_label`` -> 0, the other tags seen in ``sentences`` sorted, from 1."""
    seen = {t for s in sentences for t in s.tags}
    seen.discard(pad_label)
    return {pad_label: 0, **{t: i for i, t in enumerate(sorted(seen), 1)}}


def write_label_ids(path: str | Path, label_map: dict[str, int]) -> None:
    """Save a label map as ``label_ids.csv``: one label per line, in id order."""
    ids = sorted(label_map.values())
    if ids != list(range(len(ids))):
        raise DataError(f"label ids must be 0..{len(ids) - 1} without gaps, got {ids}", str(path))
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(sorted(label_map, key=label_map.get)) + "\n")


def read_label_ids(path: str | Path) -> dict[str, int]:
    """Read ``label_ids.csv`` (one label per line, id = line number from 0)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("label map not found (expected label_ids.csv, one label per line)", str(path))
    out: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        label = line.strip()
        if not label:
            raise DataError("empty label", str(path), lineno)
        if label in out:
            raise DataError(f"duplicate label {label!r}", str(path), lineno)
        out[label] = lineno - 1
    return out


def class_weights(sentences: Iterable[Sentence], label_map: dict[str, int]) -> list[float]:
    """Inverse-frequency weights for ``class_balancing: weighted_loss`` (NeMo: total / (n_classes * count))."""
    counts = [0] * len(label_map)
    for s in sentences:
        for t in s.tags:
            counts[label_map[t]] += 1
    total = sum(counts)
    return [total / (len(counts) * c) if c else 0.0 for c in counts]


# --- sub-word alignment ---------------------------------------------------------------------------
@dataclass
class NerFeature:
    """One encoded sentence: ids with [CLS]/[SEP], labels per sub-token and the masks NeMo uses."""

    input_ids: list[int]
    labels: list[int]          # IGNORE_INDEX where the loss must not look
    loss_mask: list[int]       # 1 where the loss looks (same information as labels != IGNORE_INDEX)
    subtokens_mask: list[int]  # 1 at the first sub-token of each word: where predictions are read
    word_ids: list[int | None]  # word index of every position (None for [CLS]/[SEP])
    num_words: int


def encode_sentences(sentences: Sequence[Sentence], tokenizer, label_map: dict[str, int],
                     max_seq_length: int = 128, ignore_extra_tokens: bool = False,
                     ignore_start_end: bool = True) -> list[NerFeature]:
    """Tokenize words into sub-tokens and align labels under the chosen scheme.

    ``tokenizer`` is a :class:`bio_megatron.vocab.wordpiece.WordPieceTokenizer`. Sequences longer than
    ``max_seq_length`` (with [CLS]/[SEP]) are truncated; words cut off get no prediction position and
    :func:`word_predictions` fills them with the pad label.
    """
    if max_seq_length < 3:
        raise DataError(f"max_seq_length ({max_seq_length}) must leave room for [CLS], [SEP] and a token")
    encodings = tokenizer.backend.encode_batch([s.words for s in sentences], is_pretokenized=True,
                                               add_special_tokens=False)
    features, truncated = [], 0
    for i, (s, enc) in enumerate(zip(sentences, encodings)):
        try:
            tag_ids = [label_map[t] for t in s.tags]
        except KeyError as exc:
            raise DataError(f"sentence {i}: tag {exc.args[0]!r} is not in the label map {sorted(label_map)}") from None
        ids, wids = enc.ids[: max_seq_length - 2], enc.word_ids[: max_seq_length - 2]
        truncated += len(enc.ids) > len(ids)
        input_ids = [tokenizer.cls] + ids + [tokenizer.sep]
        word_ids = [None] + list(wids) + [None]
        labels, loss_mask, sub_mask = [], [], []
        prev = None
        for w in word_ids:
            if w is None:  # [CLS]/[SEP]: labelled as pad so they are learnable when not ignored
                labels.append(IGNORE_INDEX if ignore_start_end else 0)  # 0 = pad label
                loss_mask.append(0 if ignore_start_end else 1)
                sub_mask.append(0)
            else:
                first = w != prev
                keep = first or not ignore_extra_tokens
                labels.append(tag_ids[w] if keep else IGNORE_INDEX)
                loss_mask.append(int(keep))
                sub_mask.append(int(first))
            prev = w
        features.append(NerFeature(input_ids, labels, loss_mask, sub_mask, word_ids, len(s.words)))
    if truncated:
        log.warning("%d of %d sentences were longer than max_seq_length=%d sub-tokens and were truncated",
                    truncated, len(sentences), max_seq_length)
    return features


def word_predictions(token_predictions: Sequence[int], feature: NerFeature, pad_id: int = 0) -> list[int]:
    """Per-word label ids from per-position predictions, read at each word's first sub-token.

    Words without a sub-token position (cut by truncation, or empty after normalisation) get ``pad_id``.
    """
    out = [pad_id] * feature.num_words
    seen = set()
    for pos, w in enumerate(feature.word_ids):
        if w is not None and w not in seen and pos < len(token_predictions):
            out[w] = int(token_predictions[pos])
            seen.add(w)
    return out
