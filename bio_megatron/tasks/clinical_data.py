"""Readers for the clinical sentence-pair tasks of BLUE and BioELECTRA, in the files their releases ship.

* MedNLI (Romanov & Shivade 2018; PhysioNet ``mli_{train,dev,test}_v1.jsonl``): JSON lines in SNLI's layout,
  one pair per line, ``{"sentence1": premise, "sentence2": hypothesis, "gold_label": "entailment" |
  "neutral" | "contradiction", "pairID": ..., ...}`` (the parse fields are ignored). Id: ``pairID``, or the line
  number where a line has none. Metric: accuracy over the three classes.
* ClinicalSTS (n2c2 2019 track 1, ``clinicalSTS2019.train.txt``): ``sentence1<TAB>sentence2<TAB>score`` per
  line, no header, score the annotators' mean similarity in [0, 5]; the test release's
  ``clinicalSTS2019.test.txt`` has the pairs only and ``clinicalSTS2019.test.gs.sim.txt`` the scores, one a line,
  read together. Id: the line number. Metric: Pearson's r (:func:`bio_megatron.evaluation.blurb.pearson_scores`).

Both plug into ``finetune classify`` (``model.dataset.task_name: mednli | clinicalsts``, the table in
:mod:`bio_megatron.tasks.classify_data`) and ``bio-megatron evaluate mednli|clinicalsts`` (:data:`EVALUATORS`).
These datasets need credentials (PhysioNet, n2c2): the tests use synthetic files in the same format
(``tests/fixtures/clinical``). Bad input is a :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping

from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.blurb_data import ScoreExample, TextExample
from bio_megatron.tasks.blurb_scoring import Evaluator
from bio_megatron.utils.errors import DataError

MEDNLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
CLINICALSTS_RANGE: tuple[float, float] = (0.0, 5.0)
_MEDNLI = ('JSON lines {"sentence1": premise, "sentence2": hypothesis, "gold_label": one of '
           f'{list(MEDNLI_LABELS)}, "pairID": id}} (MedNLI\'s mli_*_v1.jsonl)')
_STS = "'sentence1<TAB>sentence2<TAB>score' lines, score in [0, 5] (n2c2 2019 ClinicalSTS)"


def _unique(ids: dict[str, int], record_id: str, path: Path | str, lineno: int) -> None:
    if record_id in ids:
        raise DataError(f"id {record_id!r} already used on line {ids[record_id]}; ids must be unique", str(path),
                        lineno)
    ids[record_id] = lineno


def read_mednli(path: Path | str) -> list[TextExample]:
    """MedNLI pairs: premise as ``text``, hypothesis as ``text_b``, ``gold_label`` as ``label``."""
    out: list[TextExample] = []
    ids: dict[str, int] = {}
    for lineno, line in iter_lines(path, _MEDNLI):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"broken JSON ({exc.msg}); expected {_MEDNLI}", str(path), lineno) from None
        if not isinstance(record, dict):
            raise DataError(f"not a JSON object; expected {_MEDNLI}", str(path), lineno)
        for key in ("sentence1", "sentence2", "gold_label"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise DataError(f'no non-empty string "{key}"; expected {_MEDNLI}', str(path), lineno)
        label = record["gold_label"]
        if label not in MEDNLI_LABELS:
            raise DataError(f"gold_label {label[:40]!r} is not one of {list(MEDNLI_LABELS)}", str(path), lineno)
        pair_id = record.get("pairID")
        record_id = str(pair_id) if isinstance(pair_id, (str, int)) and str(pair_id) else str(lineno)
        _unique(ids, record_id, path, lineno)
        out.append(TextExample(record_id, record["sentence1"], label, record["sentence2"]))
    if not out:
        raise DataError(f"no pairs; expected {_MEDNLI}", str(path))
    return out


def _sts_score(raw: str, path: Path | str, lineno: int) -> float:
    low, high = CLINICALSTS_RANGE
    try:
        score = float(raw)
    except ValueError:
        score = math.nan
    if not (math.isfinite(score) and low <= score <= high):
        raise DataError(f"score {raw[:30]!r} is not a number in [{low:g}, {high:g}]", str(path), lineno)
    return score


def scores_file(path: Path | str) -> Path:
    """Where the n2c2 test release keeps the scores of ``clinicalSTS2019.test.txt``:
    ``clinicalSTS2019.test.gs.sim.txt``."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".txt") + ".gs.sim.txt")


def read_clinicalsts(path: Path | str) -> list[ScoreExample]:
    """ClinicalSTS pairs with their gold similarity score; the id is the line number (the release has none).

    A file of score-less pairs (``sentence1<TAB>sentence2``, the n2c2 test release) takes its scores from
    :func:`scores_file` beside it, one score a line, as many lines as pairs."""
    rows: list[tuple[int, str, str, str | None]] = []
    for lineno, line in iter_lines(path, _STS):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3) or (rows and (len(fields) == 3) != (rows[0][3] is not None)):
            raise DataError(f"{len(fields)} tab-separated field(s); expected {_STS} (or, for the test release, "
                            "'sentence1<TAB>sentence2' on every line)", str(path), lineno)
        if not fields[0].strip() or not fields[1].strip():
            raise DataError(f"an empty sentence; expected {_STS}", str(path), lineno)
        rows.append((lineno, fields[0], fields[1], fields[2] if len(fields) == 3 else None))
    if not rows:
        raise DataError(f"no pairs; expected {_STS}", str(path))
    if rows[0][3] is not None:
        return [ScoreExample(str(n), a, b, _sts_score(raw, path, n)) for n, a, b, raw in rows]  # type: ignore[arg-type]
    gs = scores_file(path)
    if not gs.is_file():
        raise DataError(f"pairs without scores (the n2c2 test release); their scores are read from {gs.name} beside "
                        "it, which is missing", str(path))
    scores = [(n, line) for n, line in iter_lines(gs, "one score in [0, 5] a line") if line.strip()]
    if len(scores) != len(rows):
        raise DataError(f"{len(scores)} scores for the {len(rows)} pairs of {path}", str(gs))
    return [ScoreExample(str(n), a, b, _sts_score(raw.strip(), gs, sn))
            for (n, a, b, _), (sn, raw) in zip(rows, scores)]


def _mednli(gold: str, pred: str, label_map: Mapping[int, str] | None = None):
    from bio_megatron.evaluation.blurb import accuracy_scores
    from bio_megatron.evaluation.blurb_predictions import label_parser, read_json_predictions

    examples = read_mednli(gold)
    ids = [e.id for e in examples]
    preds = read_json_predictions(pred, "label", ids, label_parser(MEDNLI_LABELS, label_map), gold)
    return accuracy_scores([e.label for e in examples], [preds[i] for i in ids], MEDNLI_LABELS)


def _clinicalsts(gold: str, pred: str):
    from bio_megatron.evaluation.blurb import pearson_scores
    from bio_megatron.evaluation.blurb_predictions import read_json_predictions, score_parser

    examples = read_clinicalsts(gold)
    preds = read_json_predictions(pred, "score", [e.id for e in examples], score_parser, gold)
    return pearson_scores([e.score for e in examples], [preds[e.id] for e in examples])


_JSONL = "JSON lines, one per gold pair: "
EVALUATORS: dict[str, Evaluator] = {
    "mednli": Evaluator("MedNLI accuracy over entailment/neutral/contradiction", _MEDNLI,
                        _JSONL + '{"id": "<pairID>", "label": "entailment"|"neutral"|"contradiction"}', _mednli, True),
    "clinicalsts": Evaluator("ClinicalSTS Pearson correlation", _STS,
                             _JSONL + '{"id": "<line number in the gold file>", "score": <number>}', _clinicalsts),
}


def is_mednli_release(path: Path | str) -> bool:
    """Whether a ``.jsonl`` file is in MedNLI's release layout (its first record has ``sentence1``), not the
    ``{"id", "text", "text_b"}`` lines ``predict classify`` otherwise reads; an unreadable file is not."""
    try:
        for _, line in iter_lines(path, _MEDNLI):
            if line.strip():
                record = json.loads(line)
                return isinstance(record, dict) and "sentence1" in record
    except (DataError, json.JSONDecodeError):
        return False  # the caller's own reader reports the problem with its line
    return False
