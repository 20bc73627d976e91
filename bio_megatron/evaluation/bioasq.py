"""BioASQ Task B phase B factoid scores, equal to the official evaluator, and the n-best -> submission step.

Scores: the 2nd-4th numbers that the official ``java evaluation.EvaluatorTask1b -phaseB -e 5 golden.json
submission.json`` prints (BioASQ/Evaluation-Measures, ``flat/BioASQEvaluation``, commit 8c8e689; checked
against its output in ``tests/fixtures/bioasq``):

- Golden and submitted strings are lower-cased and otherwise compared exactly (no trimming, no punctuation
  removal): ``"ABL1 "`` and ``"bcr-abl1."`` do not match ``ABL1`` / ``BCR-ABL1``.
- A golden ``exact_answer`` is a list of synonym lists; a submitted answer matches when it equals any synonym
  of any of the lists.
- A submitted ``exact_answer`` is a ranked list of lists. Only the first string of each inner list is used
  (since BioASQ 5 submissions carry no synonyms) and an empty inner list is dropped, so it takes no rank.
- Strict accuracy: the first answer matches; lenient accuracy: any answer matches; MRR: 1/rank of the first
  match. Every submitted answer is scored, not only 5, as the official tool does (BioASQ allows 5, so more
  logs a warning).
- Means over the golden factoid questions whose id is in the submission (question types come from the
  golden file); a duplicated submission id counts once, by its first occurrence; a submitted question
  without ``exact_answer``, or with a string there (the yes/no form), scores 0; no scored question gives 0.

Output: ``strict_accuracy``, ``lenient_accuracy``, ``mrr`` (fractions, as the evaluator prints them),
``scored_questions`` and ``missing_questions`` (golden factoid questions absent from the submission).

Where the official evaluator stops with an exception instead of printing scores, we choose:

- A golden question missing from the submission: with ``-e 5`` this version dies with a NullPointerException
  (its ``resp == null`` check only applies to ``-e 9``); ``-e 9`` and earlier versions skip the question.
  We skip it and count it in ``missing_questions``.
- ``"exact_answer": null`` in the submission: its reader dies; we score it 0, like an absent one.
- A submitted ``exact_answer`` that is a flat list of strings (``["a", "b"]``) or anything else that is not
  a list of lists of strings: :class:`DataError` naming the file and question.
- A golden factoid ``exact_answer`` given as a flat list of strings (the BioASQ 1-2 form) is read as the
  synonyms of one answer, with a warning; a golden factoid id listed twice is a :class:`DataError` (the
  official tool would score it twice).
- Lower-casing is Python's ``str.lower()``; it agrees with Java's ``String.toLowerCase()`` in an English or
  root default locale (checked on Greek letters), not with Java's Turkish or Lithuanian rules.

The submission step follows the BioBERT/BioMegatron recipe (dmis-lab/biobert
``biocodes/transform_nbset2bioasqform.py``): the n-best spans of all snippets of a question (snippet ids
``<question id>_<NNN>``) are pooled and sorted by probability, case-insensitive duplicates merged by
summing their probabilities (the most probable spelling is kept), and the 5 most probable kept. Empty and
over-100-character answers are dropped. Unlike BioBERT, trailing ``,`` ``.`` and spaces (and leading spaces)
are stripped first, the project's recipe (docs/EVALUATION.md).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

from bio_megatron.evaluation.inputs import first_few
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

MAX_ANSWERS = 5
MAX_ANSWER_CHARS = 100
_SNIPPET_SUFFIX = re.compile(r"_\d+$")
_SHAPE = 'a list of lists of strings, e.g. [["a"], ["b"]]'


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _string_lists(value: Any, where: str, path: str | None) -> list[list[str]]:
    """``[["a", "a'"], ["b"]]`` as the official reader accepts it; JSON integers read as their digits."""
    if not isinstance(value, list) or not all(isinstance(entry, list) for entry in value):
        raise DataError(f'{where}: "exact_answer" must be {_SHAPE}; got {_short(value)}', path)
    out = []
    for entry in value:
        strings = []
        for s in entry:
            if isinstance(s, bool) or not isinstance(s, (str, int)):
                raise DataError(f'{where}: "exact_answer" must be {_SHAPE}; got {_short(s)} inside '
                                f"{_short(entry)}", path)
            strings.append(str(s))
        out.append(strings)
    return out


def ranked_answers(exact_answer: Any, where: str = "submitted question", path: str | None = None) -> list[str]:
    """The answers the official evaluator ranks for a submitted factoid ``exact_answer``: the first string of
    each non-empty inner list. ``None`` (absent or null) and a string (the yes/no form) give no answers."""
    if exact_answer is None or isinstance(exact_answer, str):
        return []
    return [entry[0] for entry in _string_lists(exact_answer, where, path) if entry]


def gold_synonyms(exact_answer: Any, where: str = "golden question", path: str | None = None) -> set[str]:
    """Every lower-cased synonym of every answer of a golden factoid ``exact_answer``."""
    if isinstance(exact_answer, list) and exact_answer and all(isinstance(s, str) for s in exact_answer):
        exact_answer = [exact_answer]  # BioASQ 1-2 form: one answer, its synonyms
    return {s.lower() for entry in _string_lists(exact_answer, where, path) for s in entry}


def factoid_scores(golden: Mapping[str, Any], system: Mapping[str, Any]) -> dict:
    """Strict accuracy, lenient accuracy and MRR, as the official evaluator computes them (module docstring).

    ``golden`` maps question id -> golden ``exact_answer`` (synonym lists) of the factoid questions, in file
    order; ``system`` maps question id -> submitted ``exact_answer`` (``[["a1"], ["a2"], ...]`` or None), as
    :func:`golden_factoids` and :func:`submission_answers` read them.
    """
    strict = lenient = rr = 0.0
    scored = 0
    missing: list[str] = []
    over_limit: list[str] = []
    # summed in golden order, like the Java loop, so the floats come out bit-identical
    for qid, gold in golden.items():
        if qid not in system:
            missing.append(qid)
            continue
        synonyms = gold_synonyms(gold, f"golden question {qid!r}")
        answers = ranked_answers(system[qid], f"submitted question {qid!r}")
        if len(answers) > MAX_ANSWERS:
            over_limit.append(qid)
        scored += 1
        for rank, answer in enumerate(answers, 1):
            if answer.lower() in synonyms:
                strict += 1.0 if rank == 1 else 0.0
                lenient += 1.0
                rr += 1.0 / rank
                break
    if over_limit:
        log.warning("%d question(s) have more than %d factoid answers (e.g. %s); all are scored, as the official "
                    "evaluator does, but BioASQ accepts at most %d", len(over_limit), MAX_ANSWERS, over_limit[0],
                    MAX_ANSWERS)
    if missing:
        log.info("%d of %d golden factoid questions are not in the submission and are not scored (e.g. %s)",
                 len(missing), len(golden), missing[0])
    n = scored
    return {"strict_accuracy": strict / n if n else 0.0, "lenient_accuracy": lenient / n if n else 0.0,
            "mrr": rr / n if n else 0.0, "scored_questions": n, "missing_questions": len(missing)}


def _questions(data: Any, what: str, path: str | None) -> list[dict]:
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise DataError(f'expected a BioASQ {what} JSON object with a "questions" list', path)
    for i, q in enumerate(data["questions"]):
        if not isinstance(q, dict):
            raise DataError(f"question #{i} is not a JSON object: {_short(q)}", path)
        if not isinstance(q.get("id"), str):
            raise DataError(f'question #{i} needs a string "id"; got {_short(q.get("id"))}', path)
    return data["questions"]


def golden_factoids(golden_json: Any, path: str | None = None) -> dict[str, Any]:
    """Question id -> golden ``exact_answer`` for the factoid questions of an official golden JSON, in file
    order, checked to be a list of synonym lists (or a flat list of synonyms, the BioASQ 1-2 form)."""
    out: dict[str, Any] = {}
    flat = []
    for i, q in enumerate(_questions(golden_json, "golden", path)):
        if q.get("type") != "factoid":
            continue
        qid = q["id"]
        where = f"factoid question {qid!r} (#{i})"
        if qid in out:
            raise DataError(f"{where} is listed twice; golden question ids must be unique", path)
        if q.get("exact_answer") is None:
            raise DataError(f'{where} has no "exact_answer"', path)
        gold_synonyms(q["exact_answer"], where, path)
        if q["exact_answer"] and all(isinstance(s, str) for s in q["exact_answer"]):
            flat.append(qid)
        out[qid] = q["exact_answer"]
    if flat:
        log.warning("%s: %d golden factoid answer(s) are a flat list of strings (e.g. %s), read as the synonyms "
                    "of one answer; the official -e 5 evaluator cannot read this form", path or "golden",
                    len(flat), flat[0])
    return out


def submission_answers(submission_json: Any, path: str | None = None) -> dict[str, Any]:
    """Question id -> submitted ``exact_answer`` (None when absent or null) from a submission JSON
    (``{"questions": [{"id", "exact_answer"}]}``). A duplicated id keeps its first occurrence, as the official
    evaluator does; every question's ``exact_answer`` must be a list of lists of strings, a string (yes/no)
    or absent."""
    out: dict[str, Any] = {}
    for i, q in enumerate(_questions(submission_json, "submission", path)):
        qid, answer = q["id"], q.get("exact_answer")
        if answer is not None and not isinstance(answer, str):
            _string_lists(answer, f"question {qid!r} (#{i})", path)
        out.setdefault(qid, answer)
    return out


def check_submission_ids(golden_json: Any, golden: Mapping[str, Any], system: Mapping[str, Any],
                         golden_path: str | None = None, submission_path: str | None = None) -> None:
    """Refuse a score computed from nothing: a golden file without factoid questions, or a submission that
    answers none of them (an empty one, or one made for another golden file, whose ids are all unknown).

    A submission that scores at least one question is kept as the official evaluator scores it: golden
    questions it lacks are skipped (``missing_questions``) and ids the golden file lacks are ignored, logged.
    """
    if not golden:
        raise DataError('no factoid question (\"type\": \"factoid\") in the golden file; nothing to score',
                        golden_path)
    every_golden_id = {q["id"] for q in golden_json["questions"]}
    unknown = [qid for qid in system if qid not in every_golden_id]
    if not any(qid in system for qid in golden):
        if not system:
            raise DataError("the submission has no questions; expected one per golden factoid question, e.g. "
                            f"{first_few(golden)}", submission_path)
        if unknown:
            raise DataError(f"{len(unknown)} submitted question id(s) are not in the golden file {golden_path}: "
                            f"{first_few(unknown)}; no golden factoid question is answered (a submission for "
                            f"another golden file?)", submission_path)
        raise DataError(f"none of the {len(golden)} golden factoid questions (e.g. {first_few(golden)}) is in "
                        f"the submission; nothing to score", submission_path)
    if unknown:
        log.warning("%s: %d submitted question id(s) are not in the golden file and are ignored, as the official "
                    "evaluator does: %s", submission_path or "submission", len(unknown), first_few(unknown))


def question_id(snippet_id: str) -> str:
    """``55031181e9bde69634000014_003`` -> ``55031181e9bde69634000014`` (ids without a suffix unchanged)."""
    return _SNIPPET_SUFFIX.sub("", snippet_id)


def clean_answer(text: str) -> str:
    """Strip trailing commas, full stops and spaces (and leading spaces) from a span."""
    return text.strip().rstrip(" ,.").strip()


def pool_nbest(nbest: Mapping[str, Iterable[Mapping]], max_answers: int = MAX_ANSWERS,
               max_chars: int = MAX_ANSWER_CHARS) -> dict[str, list[tuple[str, float]]]:
    """Pool snippet n-best lists per question: question id -> [(answer, summed probability)], best first.

    ``nbest`` maps snippet id -> entries with ``text`` and ``probability`` (the n-best JSON that SQuAD
    post-processing writes). As in BioBERT's ``transform_nbset2bioasqform.py``, all pooled entries are sorted
    by probability before case-insensitive duplicates are merged, so the spelling kept is the most probable
    one (equal probabilities: snippet order). BioBERT does not strip: we strip trailing ``,`` ``.`` and spaces
    first (:func:`clean_answer`), the project's recipe.
    """
    pooled: dict[str, list[tuple[str, float]]] = {}
    for snippet_id, entries in nbest.items():
        pool = pooled.setdefault(question_id(snippet_id), [])
        for entry in entries:
            try:
                text, prob = entry["text"], float(entry["probability"])
                if not isinstance(text, str) or not math.isfinite(prob):  # NaN would scramble the ranking
                    raise TypeError(text)
            except (KeyError, TypeError, ValueError):
                raise DataError(f'n-best entry of {snippet_id!r} needs "text" and a finite numeric "probability", '
                                f"got {entry!r}") from None
            text = clean_answer(text)
            if text and len(text) <= max_chars:
                pool.append((text, prob))
    out = {}
    for qid, pool in pooled.items():
        pool.sort(key=lambda tp: -tp[1])  # stable
        merged: dict[str, list] = {}
        for text, prob in pool:
            if text.lower() in merged:
                merged[text.lower()][1] += prob
            else:
                merged[text.lower()] = [text, prob]
        ranked = sorted(merged.values(), key=lambda tp: -tp[1])[:max_answers]
        out[qid] = [(t, p) for t, p in ranked]
    return out


def build_submission(nbest: Mapping[str, Iterable[Mapping]], max_answers: int = MAX_ANSWERS,
                     max_chars: int = MAX_ANSWER_CHARS) -> dict:
    """A BioASQ phase-B submission (factoid part) from snippet n-best predictions.

    Returns ``{"questions": [{"id": qid, "type": "factoid", "exact_answer": [[a1], [a2], ...]}]}``
    with at most ``max_answers`` answers per question, most probable first.
    """
    pooled = pool_nbest(nbest, max_answers, max_chars)
    return {"questions": [{"id": qid, "type": "factoid", "exact_answer": [[t] for t, _ in answers]}
                          for qid, answers in pooled.items()]}
