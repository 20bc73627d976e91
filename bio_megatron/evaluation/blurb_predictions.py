"""Prediction files for the BLURB tasks, checked against the gold file before anything is scored.

JSON lines, one object per gold example: ``{"id", "label"}`` (classification), ``{"id", "score"}``
(BIOSSES), ``{"id", "labels": [...]}`` (HoC, one line per sentence). Tagging tasks (EBM PICO, JNLPBA)
use conlleval's columns ``token ... gold pred``. Every problem is a :class:`DataError` naming the
prediction file and line: a line that is not a JSON object, no ``id`` or value, an id the gold file does
not have, an id given twice, a label outside the task's label set; then gold ids without a prediction.
A prediction for every gold example is required: a partial file would silently score a subset.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence, TypeVar

from bio_megatron.evaluation.inputs import first_few, iter_lines
from bio_megatron.utils.errors import DataError

T = TypeVar("T")
Parser = Callable[[Any], T]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _by_id(value: int, names: Sequence[str], id_to_label: Mapping[int, str] | None) -> str:
    """The name of integer label id ``value``: only through the model's label map, since the order of a
    model's labels is its own (a model trained with another order would score silently wrong)."""
    if id_to_label is None:
        raise ValueError(f"{value} is an integer label id, but no --label-map FILE (the model's label_ids.csv) says "
                         f"which label it is; expected one of {list(names)}")
    if value not in id_to_label:
        raise ValueError(f"label id {value} is not in the label map (ids 0..{len(id_to_label) - 1})")
    return id_to_label[value]


def check_label_map(id_to_label: Mapping[int, str], names: Sequence[str], path: str | Path) -> None:
    """A label map for a task names only the task's labels (another task's label_ids.csv is refused)."""
    odd = [n for n in id_to_label.values() if n not in names]
    if odd:
        raise DataError(f"label map has {first_few(odd)}, not labels of this task; expected names of "
                        f"{list(names)}", str(path))


def label_parser(labels: Sequence[str], id_to_label: Mapping[int, str] | None = None) -> Parser[str]:
    """A label of ``labels``. An integer is a label id of ``id_to_label``; without a map only where the label
    names are themselves integers (GAD's ``1`` for ``"1"``)."""
    def parse(value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = _by_id(value, labels, id_to_label) if id_to_label is not None or str(value) not in labels \
                else str(value)
        if not isinstance(value, str) or value not in labels:
            raise ValueError(f"{_short(value)} is not one of {list(labels)}")
        return value
    return parse


def score_parser(value: Any) -> float:
    """A finite number (BIOSSES similarity)."""
    try:
        number = math.nan if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    except OverflowError:  # an integer literal too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{_short(value)} is not a finite number")
    return number


def label_set_parser(names: Sequence[str], id_to_label: Mapping[int, str] | None = None) -> Parser[frozenset[int]]:
    """A list of label indices (``0``..``len(names)-1``, the task's own order) or names; ``[]`` is no label.
    With ``id_to_label`` the integers are the model's label ids instead."""
    def parse(value: Any) -> frozenset[int]:
        if not isinstance(value, list):
            raise ValueError(f"{_short(value)} is not a list of label indices or names")
        out = set()
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool) and id_to_label is not None:
                out.add(names.index(_by_id(item, names, id_to_label)))
            elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < len(names):
                out.add(item)
            elif isinstance(item, str) and item in names:
                out.add(names.index(item))
            else:
                raise ValueError(f"holds {_short(item)}, which is neither an index 0..{len(names) - 1} nor one of "
                                 f"{list(names)}")
        return frozenset(out)
    return parse


def read_json_predictions(path: str | Path, key: str, gold_ids: Sequence[str], parse: Parser[T],
                          gold_path: str | Path | None = None) -> dict[str, T]:
    """Gold id -> parsed ``key`` of a JSON-lines prediction file; one line per gold id, no other ids."""
    expected = f'one JSON object per line, {{"id": ..., "{key}": ...}}, for every id of the gold file'
    gold = set(gold_ids)
    source = f" {gold_path}" if gold_path else ""
    out: dict[str, T] = {}
    lines: dict[str, int] = {}
    empty = True
    for lineno, line in iter_lines(path, expected):
        if not line.strip():
            continue
        empty = False
        try:
            obj = json.loads(line.removeprefix("\ufeff") if lineno == 1 else line)
        except ValueError as exc:  # JSONDecodeError, or an integer literal past Python's digit limit
            detail = f"{exc.msg} (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise DataError(f"broken JSON: {detail}; expected {expected}", str(path), lineno) from None
        if not isinstance(obj, dict):
            raise DataError(f"{_short(obj)} is not a JSON object; expected {expected}", str(path), lineno)
        pid = obj.get("id")
        if isinstance(pid, int) and not isinstance(pid, bool):
            pid = str(pid)
        if not isinstance(pid, str) or not pid:
            raise DataError(f'no string "id" (got {_short(obj.get("id"))}); expected {expected}', str(path), lineno)
        if key not in obj:
            raise DataError(f'id {pid!r} has no "{key}"; expected {expected}', str(path), lineno)
        if pid not in gold:
            raise DataError(f"id {pid!r} is not in the gold file{source}", str(path), lineno)
        if pid in out:
            raise DataError(f"id {pid!r} is predicted twice (also on line {lines[pid]})", str(path), lineno)
        try:
            out[pid] = parse(obj[key])
        except ValueError as exc:
            raise DataError(f'id {pid!r}: "{key}" {exc}', str(path), lineno) from None
        lines[pid] = lineno
    if empty:
        raise DataError(f"empty file (expected {expected})", str(path))
    missing = [i for i in gold_ids if i not in out]
    if missing:
        raise DataError(f"{len(missing)} of the {len(gold_ids)} ids of the gold file{source} have no prediction: "
                        f"{first_few(missing)}; expected {expected}", str(path))
    return out


_BOUNDARIES = ("-X-", "-DOCSTART-")


def read_conll_predictions(path: str | Path, gold_words: Sequence[Sequence[str]],
                           gold_tags: Sequence[Sequence[str]], tags: Collection[str],
                           gold_path: str | Path | None = None) -> list[list[str]]:
    """Predicted tags per gold sentence from conlleval columns (``token ... gold pred``).

    The file's words must be the gold file's words in order and its gold column the gold tags (a
    file made for another split or tokenisation fails at its first different line); its own sentence
    breaks, ``-X-`` and ``-DOCSTART-`` lines are not used: the gold file's sentences are.
    """
    expected = f"conlleval columns 'token ... gold pred' for the words of the gold file, predicted tags {sorted(tags)}"
    source = f" of {gold_path}" if gold_path else ""
    flat = [(s, w) for s, words in enumerate(gold_words) for w in range(len(words))]
    pred: list[list[str]] = [[] for _ in gold_words]
    k = 0
    for lineno, line in iter_lines(path, expected):
        fields = line.split()
        if not fields or fields[0] in _BOUNDARIES:
            continue
        if len(fields) < 3:
            raise DataError(f"{len(fields)} field(s) {line.strip()[:60]!r}; expected {expected}", str(path), lineno)
        if k == len(flat):
            raise DataError(f"more words than the {len(flat)} of the gold file{source}", str(path), lineno)
        s, w = flat[k]
        word, gold, tag = fields[0], fields[-2], fields[-1]
        if word != gold_words[s][w] or gold != gold_tags[s][w]:
            raise DataError(f"{word!r} tagged {gold!r}, but word {k + 1} of the gold file{source} is "
                            f"{gold_words[s][w]!r} tagged {gold_tags[s][w]!r} (sentence {s + 1})", str(path), lineno)
        if tag not in tags:
            raise DataError(f"predicted tag {tag!r} is not one of {sorted(tags)}", str(path), lineno)
        pred[s].append(tag)
        k += 1
    if k == 0:
        raise DataError(f"no words (expected {expected})", str(path))
    if k < len(flat):
        raise DataError(f"{k} words, but the gold file{source} has {len(flat)}; expected {expected}", str(path))
    return pred
