"""Readers for BLURB's classification, regression and multi-label files, exactly as BLURB distributes them.

One typed record per example, with the id the data gives (PMID, pair id, ``index``); formats and the
split sizes they are checked against: docs/EVALUATION.md and each dataset's ``SOURCES.md``.

* PubMedQA (PQA-L): a JSON object PMID -> ``{"QUESTION", "CONTEXTS": [...], "final_decision", ...}``
  (``ori_pqal.json``, ``pqal_fold0/{train,dev}_set.json``, ``test_set.json``); the test labels may come
  from ``test_ground_truth.json`` (PMID -> label). Text: the question; pair text: the contexts joined
  (BLURB's reasoning-required setting, no long answer), or with ``long_answer=True`` the abstract's conclusion
  ``LONG_ANSWER`` (the reasoning-free setting of Jin et al. 2019).
* BioASQ yes/no: BioASQ's training/golden JSON, ``{"questions": [{"id", "type": "yesno", "body",
  "snippets": [{"text"}], "exact_answer": "yes"|"no"}]}``; other question types are skipped.
* DDI: ``pair id<TAB>sentence<TAB>DDI-<class>``, no header. GAD: header ``index sentence label``, label 0/1.
* BIOSSES: header ``pair_id sent1 sent2 score``.
* HoC: header ``labels sentence index``; ``labels`` is ``0_0,1_1,...,9_0`` (hallmark index _ 0/1), ``index``
  is ``PMID_sN``; the split's ``*_pmid.tsv`` (one line of comma-separated ``PMID.txt``) may be checked
  against the documents found.

Bad input is a :class:`DataError` naming the file and line; a file without a usable record is one too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from bio_megatron.evaluation.blurb import (BIOASQ_YESNO_LABELS, DDI_LABELS, GAD_LABELS, HOC_LABELS,
                                           PUBMEDQA_LABELS)
from bio_megatron.evaluation.inputs import first_few, iter_lines, line_of, load_json
from bio_megatron.utils.errors import DataError


@dataclass(frozen=True)
class TextExample:
    """A sentence (``text_b`` None) or sentence-pair classification example."""

    id: str
    text: str
    label: str
    text_b: str | None = None


@dataclass(frozen=True)
class ScoreExample:
    """A sentence pair with a gold similarity score (BIOSSES: mean of 5 annotators, 0-4)."""

    id: str
    text: str
    text_b: str
    score: float


@dataclass(frozen=True)
class MultiLabelExample:
    """One HoC sentence: its id (``PMID_sN``), its abstract's id and its hallmark indices (into HOC_LABELS)."""

    id: str
    doc_id: str
    text: str
    labels: frozenset[int]


def _tsv(path: str | Path, expected: str, n_fields: int,
         header: tuple[str, ...] | None = None) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of a tab-separated file, header checked and skipped, blank lines skipped."""
    want_header = header is not None
    for lineno, line in iter_lines(path, expected):
        if not line.strip():
            continue
        fields = line.split("\t")
        if want_header:
            want_header = False
            if tuple(f.strip() for f in fields) != header:
                raise DataError(f"header {line[:80]!r}; expected {expected}", str(path), lineno)
            continue
        if len(fields) != n_fields:
            raise DataError(f"{len(fields)} tab-separated field(s); expected {expected}", str(path), lineno)
        yield lineno, fields


class _Ids:
    """Refuses a repeated id, naming both lines: a duplicate would be scored twice or shadow a record."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.seen: dict[str, int | None] = {}  # id -> line

    def add(self, record_id: str, lineno: int | None) -> None:
        if not record_id:
            raise DataError("empty id", self.path, lineno)
        if record_id in self.seen:
            raise DataError(f"id {record_id!r} already used on line {self.seen[record_id]}; ids must be unique",
                            self.path, lineno)
        self.seen[record_id] = lineno


def _nonempty(records: list, path: str | Path, expected: str) -> list:
    if not records:
        raise DataError(f"no records; expected {expected}", str(path))
    return records


def _label(value: str, labels: tuple[str, ...], path: str | Path, lineno: int | None) -> str:
    if value not in labels:
        raise DataError(f"label {value[:60]!r} is not one of {list(labels)}", str(path), lineno)
    return value


def _labelled_tsv(path: str | Path, expected: str, labels: tuple[str, ...],
                  header: tuple[str, ...] | None = None) -> list[TextExample]:
    """``id<TAB>sentence<TAB>label`` lines (after ``header`` when given): unique ids, labels from ``labels``."""
    ids, out = _Ids(path), []
    for lineno, (pid, text, label) in _tsv(path, expected, 3, header):
        ids.add(pid, lineno)
        out.append(TextExample(pid, text, _label(label.strip(), labels, path, lineno)))
    return _nonempty(out, path, expected)


def read_ddi(path: str | Path) -> list[TextExample]:
    """DDI-2013 in BLURB's form: ``id<TAB>sentence with @DRUG$<TAB>label``."""
    return _labelled_tsv(path, f"'pair id<TAB>sentence<TAB>label' lines, label one of {list(DDI_LABELS)}", DDI_LABELS)


def read_gad(path: str | Path) -> list[TextExample]:
    """GAD in BLURB's form: header ``index sentence label``, label ``0`` or ``1``."""
    return _labelled_tsv(path, "a header 'index<TAB>sentence<TAB>label', then one example per line, label 0 or 1",
                         GAD_LABELS, ("index", "sentence", "label"))


def read_biosses(path: str | Path) -> list[ScoreExample]:
    """BIOSSES in BLURB's form: header ``pair_id sent1 sent2 score``."""
    expected = "a header 'pair_id<TAB>sent1<TAB>sent2<TAB>score', then one pair per line"
    ids, out = _Ids(path), []
    for lineno, (pid, a, b, score) in _tsv(path, expected, 4, ("pair_id", "sent1", "sent2", "score")):
        ids.add(pid, lineno)
        try:
            value = float(score)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise DataError(f"score {score[:30]!r} is not a number; expected {expected}", str(path), lineno)
        out.append(ScoreExample(pid, a, b, value))
    return _nonempty(out, path, expected)


_HOC_CELL = re.compile(r"^(\d+)_([01])$")


def _hoc_labels(field: str, path: str | Path, lineno: int) -> frozenset[int]:
    cells = [_HOC_CELL.match(c.strip()) for c in field.split(",")]
    indices = [int(m.group(1)) for m in cells if m]
    if None in cells or sorted(indices) != list(range(len(HOC_LABELS))):
        raise DataError(f"labels {field[:80]!r}; expected each of 0_v .. {len(HOC_LABELS) - 1}_v once, v 0 or 1",
                        str(path), lineno)
    return frozenset(int(m.group(1)) for m in cells if m and m.group(2) == "1")


def read_pmid_list(path: str | Path) -> list[str]:
    """A BLURB split index (``*_pmid.tsv``): one line of comma-separated PMIDs, HoC's with ``.txt``."""
    expected = "one line of comma-separated PMIDs"
    pmids, lines = [], {}
    for lineno, line in iter_lines(path, expected):
        for item in (i.strip() for i in line.split(",")):
            if not item:
                continue
            pmid = item.removesuffix(".txt")
            if pmid in lines:
                raise DataError(f"PMID {pmid} listed twice (also on line {lines[pmid]})", str(path), lineno)
            pmids.append(pmid)
            lines[pmid] = lineno
    return _nonempty(pmids, path, expected)


def check_documents(found: Mapping[str, int], path: str | Path, pmid_path: str | Path) -> None:
    """The documents of a split (PMID -> first line) must be exactly those its ``*_pmid.tsv`` lists."""
    listed = set(read_pmid_list(pmid_path))
    extra = [(pmid, line) for pmid, line in found.items() if pmid not in listed]
    if extra:
        raise DataError(f"document {extra[0][0]} is not in {pmid_path} ({len(extra)} such)", str(path), extra[0][1])
    absent = sorted(listed - set(found))
    if absent:
        raise DataError(f"{len(absent)} PMID(s) of {pmid_path} have no record in {path}: {first_few(absent)}",
                        str(path))


def read_hoc(path: str | Path, pmids: str | Path | None = None) -> list[MultiLabelExample]:
    """HoC sentences with their abstract (the ``index`` prefix before ``_``, as BLURB groups them)."""
    expected = "a header 'labels<TAB>sentence<TAB>index', then 'i_v,...<TAB>sentence<TAB>PMID_sN' lines"
    ids, out, docs = _Ids(path), [], {}
    for lineno, (labels, text, index) in _tsv(path, expected, 3, ("labels", "sentence", "index")):
        index = index.strip()
        if "_" not in index:
            raise DataError(f"index {index[:40]!r} has no '_'; expected PMID_sN", str(path), lineno)
        ids.add(index, lineno)
        doc = index.split("_", 1)[0]
        docs.setdefault(doc, lineno)
        out.append(MultiLabelExample(index, doc, text, _hoc_labels(labels, path, lineno)))
    _nonempty(out, path, expected)
    if pmids is not None:
        check_documents(docs, path, pmids)
    return out


# --- JSON formats ----------------------------------------------------------------------------------
def _where(path: str | Path, key: str) -> int | None:
    return line_of(path, f'"{key}"')  # only on the error path: it scans the file


def read_pubmedqa_labels(path: str | Path) -> dict[str, str]:
    """PMID -> gold label from ``test_ground_truth.json`` (PMID -> label) or a PQA-L file (``final_decision``)."""
    expected = "a JSON object PMID -> 'yes'|'no'|'maybe' or PMID -> {..., \"final_decision\"}"
    data = load_json(path, expected)
    if not isinstance(data, dict) or not data:
        raise DataError(f"expected {expected}", str(path))
    out = {}
    for pmid, value in data.items():
        label = value.get("final_decision") if isinstance(value, dict) else value
        if label not in PUBMEDQA_LABELS:
            raise DataError(f"PMID {pmid}: label {str(label)[:40]!r} is not one of {list(PUBMEDQA_LABELS)}",
                            str(path), _where(path, pmid))
        out[pmid] = label
    return out


def read_pubmedqa(path: str | Path, ground_truth: str | Path | None = None,
                  long_answer: bool = False) -> list[TextExample]:
    """PQA-L examples; with ``ground_truth`` the labels come from it (and must agree with the file's own).
    ``long_answer``: the pair text is the conclusion (``LONG_ANSWER``) instead of the contexts (reasoning-free)."""
    expected = 'a JSON object PMID -> {"QUESTION": str, "CONTEXTS": [str, ...], "final_decision": ...}'
    if long_answer:
        expected = expected.replace('"final_decision"', '"LONG_ANSWER": str, "final_decision"')
    data = load_json(path, expected)
    if not isinstance(data, dict):
        raise DataError(f"expected {expected}", str(path))
    truth = read_pubmedqa_labels(ground_truth) if ground_truth is not None else {}
    out = []
    for pmid, rec in data.items():
        question, contexts = (rec.get("QUESTION"), rec.get("CONTEXTS")) if isinstance(rec, dict) else (None, None)
        if not isinstance(question, str) or not isinstance(contexts, list) \
                or not all(isinstance(c, str) for c in contexts):
            raise DataError(f"PMID {pmid}: expected {expected}", str(path), _where(path, pmid))
        if long_answer and not isinstance(rec.get("LONG_ANSWER"), str):
            raise DataError(f"PMID {pmid}: no string LONG_ANSWER (the reasoning-free setting needs it); expected "
                            f"{expected}", str(path), _where(path, pmid))
        label = rec.get("final_decision")
        if ground_truth is not None:
            if pmid not in truth:
                raise DataError(f"PMID {pmid} has no label in {ground_truth}", str(path), _where(path, pmid))
            if label is not None and label != truth[pmid]:
                raise DataError(f"PMID {pmid}: final_decision {label!r} but {ground_truth} says {truth[pmid]!r}",
                                str(path), _where(path, pmid))
            label = truth[pmid]
        if label not in PUBMEDQA_LABELS:
            raise DataError(f"PMID {pmid}: final_decision {str(label)[:40]!r} is not one of {list(PUBMEDQA_LABELS)}",
                            str(path), _where(path, pmid))
        out.append(TextExample(pmid, question, label, rec["LONG_ANSWER"] if long_answer else " ".join(contexts)))
    extra = [pmid for pmid in truth if pmid not in data]
    if extra:
        raise DataError(f"{len(extra)} PMID(s) are not in {path}: {first_few(extra)}", str(ground_truth))
    return _nonempty(out, path, expected)


def _bioasq_question(q: dict, i: int, path: str | Path) -> TextExample:
    qid = q.get("id")
    if not isinstance(qid, str) or not qid:
        raise DataError(f'question #{i} needs a string "id"', str(path))

    def bad(what: str) -> DataError:  # the line is looked up only when there is an error to report
        return DataError(f"yes/no question {qid!r} (#{i}): {what}", str(path), _where(path, qid))

    if not isinstance(q.get("body"), str):
        raise bad('needs a string "body"')
    snippets = q.get("snippets", [])
    if not isinstance(snippets, list) or not all(isinstance(s, dict) and isinstance(s.get("text"), str)
                                                 for s in snippets):
        raise bad('"snippets" must be a list of {"text": ...} objects')
    answer = q.get("exact_answer")
    label = answer.strip().lower() if isinstance(answer, str) else None
    if label not in BIOASQ_YESNO_LABELS:
        raise bad(f'"exact_answer" {str(answer)[:40]!r} is not "yes" or "no"')
    return TextExample(qid, q["body"], label, " ".join(s["text"] for s in snippets))


def read_bioasq_yesno(path: str | Path) -> list[TextExample]:
    """The yes/no questions of a BioASQ training or golden JSON: question body, snippets joined, answer."""
    expected = 'a BioASQ JSON object {"questions": [{"id", "type": "yesno", "body", "snippets", "exact_answer"}]}'
    data = load_json(path, expected)
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise DataError(f"expected {expected}", str(path))
    out, seen = [], set()
    for i, q in enumerate(data["questions"]):
        if not isinstance(q, dict):
            raise DataError(f"question #{i} is not a JSON object; expected {expected}", str(path))
        if q.get("type") != "yesno":
            continue
        example = _bioasq_question(q, i, path)
        if example.id in seen:
            raise DataError(f"yes/no question {example.id!r} is listed twice", str(path), _where(path, example.id))
        seen.add(example.id)
        out.append(example)
    if not out:
        raise DataError(f'no yes/no question ("type": "yesno"); expected {expected}', str(path))
    return out
