"""BioASQ Task B phase B factoid scores and the n-best -> submission step.

Scores (as the official ``EvaluatorTask1b -phaseB -e 5`` computes them for factoid questions):
every string is lower-cased; a system answer matches when it equals any gold synonym exactly;
strict accuracy counts questions whose first answer matches, lenient accuracy those where any of the
(up to 5) answers matches, MRR averages 1/rank of the first matching answer (0 if none). All three are
means over the factoid questions of the golden file, so a question missing from the submission scores
0. Values are fractions in [0, 1], as the evaluator prints them.

The submission step follows the BioBERT/BioMegatron recipe: the n-best spans of all snippets of a
question (snippet ids ``<question id>_<NNN>``) are pooled, trailing ``,`` ``.`` and spaces stripped,
empty or over-100-character answers dropped, case-insensitive duplicates merged by summing their
probabilities, and the 5 most probable kept.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from bio_megatron.utils.errors import DataError

MAX_ANSWERS = 5
MAX_ANSWER_CHARS = 100
_SNIPPET_SUFFIX = re.compile(r"_\d+$")


def _flatten(answer) -> list[str]:
    """Gold/system ``exact_answer`` entries are strings or (nested) lists of synonyms."""
    if isinstance(answer, str):
        return [answer]
    out: list[str] = []
    for a in answer or []:
        out.extend(_flatten(a))
    return out


def factoid_scores(golden: Mapping[str, Sequence], system: Mapping[str, Sequence],
                   max_answers: int = MAX_ANSWERS) -> dict:
    """Strict accuracy, lenient accuracy and MRR over the questions of ``golden``.

    ``golden`` maps question id -> gold ``exact_answer`` (synonyms, possibly nested lists);
    ``system`` maps question id -> ranked answers, each a string or a list of synonyms.
    """
    strict = lenient = rr = 0.0
    for qid, gold in golden.items():
        synonyms = {s.lower() for s in _flatten(gold)}
        answers = list(system.get(qid, []))[:max_answers]
        for rank, answer in enumerate(answers, 1):
            if any(a.lower() in synonyms for a in _flatten(answer)):
                strict += rank == 1
                lenient += 1
                rr += 1.0 / rank
                break
    n = len(golden)
    return {"strict_accuracy": strict / n if n else 0.0, "lenient_accuracy": lenient / n if n else 0.0,
            "mrr": rr / n if n else 0.0, "questions": n}


def golden_factoids(golden_json: dict, path: str | None = None) -> dict[str, list]:
    """Question id -> gold ``exact_answer`` for the factoid questions of an official golden JSON."""
    if not isinstance(golden_json, dict) or not isinstance(golden_json.get("questions"), list):
        raise DataError('expected a BioASQ golden JSON object with a "questions" list', path)
    out = {}
    for i, q in enumerate(golden_json["questions"]):
        if q.get("type") != "factoid":
            continue
        if "id" not in q or "exact_answer" not in q:
            raise DataError(f'factoid question #{i} lacks "id" or "exact_answer"', path)
        out[q["id"]] = q["exact_answer"]
    return out


def submission_answers(submission_json: dict, path: str | None = None) -> dict[str, list]:
    """Question id -> ranked answers from a submission JSON (``{"questions": [{"id", "exact_answer"}]}``)."""
    if not isinstance(submission_json, dict) or not isinstance(submission_json.get("questions"), list):
        raise DataError('expected a BioASQ submission JSON object with a "questions" list', path)
    out = {}
    for i, q in enumerate(submission_json["questions"]):
        if "id" not in q:
            raise DataError(f'question #{i} has no "id"', path)
        out[q["id"]] = list(q.get("exact_answer") or [])
    return out


def question_id(snippet_id: str) -> str:
    """``55031181e9bde69634000014_003`` -> ``55031181e9bde69634000014`` (ids without a suffix unchanged)."""
    return _SNIPPET_SUFFIX.sub("", snippet_id)


def clean_answer(text: str) -> str:
    """Strip trailing commas, full stops and spaces (and leading spaces) from a span."""
    return text.strip().rstrip(" ,.").strip()


def pool_nbest(nbest: Mapping[str, Iterable[Mapping]], max_answers: int = MAX_ANSWERS,
               max_chars: int = MAX_ANSWER_CHARS) -> dict[str, list[tuple[str, float]]]:
    """Pool snippet n-best lists per question: question id -> [(answer, summed probability)], best first.

    ``nbest`` maps snippet id -> entries with ``text`` and ``probability`` (the n-best JSON that
    SQuAD post-processing writes). The first spelling seen of a case-insensitive group is kept.
    """
    pooled: dict[str, dict[str, list]] = {}
    for snippet_id, entries in nbest.items():
        group = pooled.setdefault(question_id(snippet_id), {})
        for entry in entries:
            try:
                text, prob = entry["text"], float(entry["probability"])
            except (KeyError, TypeError, ValueError):
                raise DataError(f'n-best entry of {snippet_id!r} needs "text" and a numeric "probability", '
                                f"got {entry!r}") from None
            text = clean_answer(text)
            if not text or len(text) > max_chars:
                continue
            key = text.lower()
            if key in group:
                group[key][1] += prob
            else:
                group[key] = [text, prob]
    out = {}
    for qid, group in pooled.items():
        # stable sort: equal probabilities keep first-seen order
        ranked = sorted(group.values(), key=lambda tp: -tp[1])[:max_answers]
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
