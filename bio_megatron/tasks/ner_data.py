"""NER data: IOB ``token<TAB>tag`` files, NeMo ``text_*.txt``/``labels_*.txt``, label maps, sub-word alignment.

Label ids follow NeMo: the ``pad_label`` (``O``) is id 0 and the other labels follow in sorted order;
the map is saved as ``label_ids.csv`` (one label per line, the line number is the id).

Sub-word labels (paper Figure 1) come in two schemes:
``ignore_extra_tokens=False``: every sub-token is labelled;
``ignore_extra_tokens=True``: only the first sub-token is labelled, the rest get ``IGNORE_INDEX``.
A labelled later sub-token of a ``B-X`` word is ``I-X`` under ``continuation="inside"`` (transformers' run_ner
``b_to_i_label``: the sub-tokens read left to right are valid IOB, so ``pipeline("token-classification",
aggregation_strategy="simple")``, which groups sub-tokens, finds whole entities), or ``B-X`` like the first under
``continuation="word"`` (NeMo's: each sub-token carries its word's label; "simple" then splits every word into
entities of one sub-token). ``ignore_start_end`` masks [CLS]/[SEP] out of the loss. Predictions are per word,
read at the word's first sub-token (:func:`word_predictions`), so the scheme changes the training targets of later
sub-tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

# The IOB format itself is read one layer down (vocab statistics read it too); these names stay importable here.
from bio_megatron.corpus.iob import Sentence, check_tag, read_iob, write_iob  # noqa: F401
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

IGNORE_INDEX = -100  # torch.nn.CrossEntropyLoss's default ignore_index


def read_nemo(text_path: str | Path, labels_path: str | Path,
              labels: Iterable[str] | None = None) -> list[Sentence]:
    """Read NeMo's ``text_*.txt`` (space-separated words) with the matching ``labels_*.txt``."""
    text_path, labels_path = Path(text_path), Path(labels_path)
    for p in (text_path, labels_path):
        if not p.is_file():
            raise DataError("file not found (NeMo NER needs text_*.txt and labels_*.txt)", str(p))
    allowed = set(labels) if labels is not None else None
    # lines end at \n only: a \x0c or \u2028 inside a sentence must not shift every later sentence's labels
    texts = [line for _, line in iter_lines(text_path, "space-separated words, one sentence per line")]
    tag_lines = [line for _, line in iter_lines(labels_path, "space-separated labels, one sentence per line")]
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
            check_tag(t, str(labels_path), lineno, allowed)
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
def build_label_map(sentences: Iterable[Sentence], pad_label: str = "O", inside: bool = False) -> dict[str, int]:
    """NeMo's label ids: ``pad_label`` -> 0, the other tags seen in ``sentences`` sorted, from 1. ``inside``: the
    ``I-X`` of every ``B-X`` seen is a label too (the ``continuation="inside"`` target of a one-word entity's later
    sub-tokens, even where no entity of that type spans two words)."""
    seen = {t for s in sentences for t in s.tags}
    if inside:
        seen |= {"I" + t[1:] for t in seen if t[:1] == "B" and t[1:2] in ("", "-")}
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
    for lineno, line in iter_lines(path, "label_ids.csv, one label per line"):
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
                     ignore_start_end: bool = True,
                     continuation: Literal["inside", "word"] = "word") -> list[NerFeature]:
    """Tokenize words into sub-tokens and align labels under the chosen scheme (module docstring).

    ``tokenizer`` is what :func:`bio_megatron.vocab.bpe.load_tokenizer` returns: WordPiece, or byte-level BPE,
    whose words each get their leading-space form as ``RobertaTokenizerFast(add_prefix_space=True)`` gives them
    (``<s>``/``</s>`` then play [CLS]/[SEP]). Sequences longer than ``max_seq_length`` (with [CLS]/[SEP]) are
    truncated; words cut off get no prediction position and :func:`word_predictions` fills them with the pad label.
    Under ``continuation="inside"`` a ``B-X`` whose ``I-X`` is not in ``label_map`` (a restored model's map from a
    run that never saw it) keeps ``B-X`` on its later sub-tokens.
    """
    if max_seq_length < 3:
        raise DataError(f"max_seq_length ({max_seq_length}) must leave room for [CLS], [SEP] and a token")
    if continuation not in ("inside", "word"):
        raise DataError(f"continuation must be 'inside' or 'word', got {continuation!r}")
    later = {i: label_map.get("I" + t[1:], i) if continuation == "inside" and t[:1] == "B" and t[1:2] in ("", "-")
             else i for t, i in label_map.items()}  # label id of a word's later sub-tokens, by the word's label id
    encodings = tokenizer.encode_words([s.words for s in sentences])
    features, truncated = [], 0
    for i, (s, enc) in enumerate(zip(sentences, encodings)):
        try:
            tag_ids = [label_map[t] for t in s.tags]
        except KeyError as exc:
            raise DataError(f"sentence {i}: tag {exc.args[0]!r} is not in the label map {sorted(label_map)}") from None
        ids, wids = enc.ids[: max_seq_length - 2], enc.word_ids[: max_seq_length - 2]
        truncated += len(enc.ids) > len(ids)
        input_ids = tokenizer.single(ids)
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
                labels.append((tag_ids[w] if first else later[tag_ids[w]]) if keep else IGNORE_INDEX)
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

    Words without a sub-token position (cut by truncation, or empty after normalisation) get ``pad_id``: a
    *label* id, the pad label's (0 in NeMo's label map), not the tokenizer's pad token (1 for RoBERTa).
    """
    out = [pad_id] * feature.num_words
    seen = set()
    for pos, w in enumerate(feature.word_ids):
        if w is not None and w not in seen and pos < len(token_predictions):
            out[w] = int(token_predictions[pos])
            seen.add(w)
    return out
