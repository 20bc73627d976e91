"""A QA dev split carved from the training file, by question, so that model selection never sees test.

BioASQ gives a training file and test batches, no dev set. Selecting the checkpoint on the test batches
(as a ``dev_file`` pointing at them would) reports a test score that the selection was tuned on. Instead a
fraction of the *training questions* is held out. BioASQ's SQuAD-format files repeat a question once per
snippet (ids ``<qid>_<NNN>``; paper §5.3: a question-answer pair repeats up to 88 times) and later years
repeat earlier questions, so every snippet of a question id, and every question with the same text, goes
to the same side; otherwise dev would be answered from memory.

Which questions are held out depends only on the question (a hash of its normalised text), not on the
file order or the seed, so every seed and grid point of a sweep is selected on the same dev questions.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

from bio_megatron.evaluation.bioasq import question_id
from bio_megatron.tasks.qa_data import QAExample
from bio_megatron.utils.errors import DataError


def _norm(question: str) -> str:
    return re.sub(r"\s+", " ", question).strip().lower()


def question_groups(examples: Sequence[QAExample]) -> list[set[str]]:
    """Example ids grouped so that a group holds every snippet of a question id and every question with the
    same (normalised) text: the connected components of "same question id or same text"."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in examples:
        a, b = find("id:" + question_id(e.qid)), find("text:" + _norm(e.question))
        if a != b:
            parent[a] = b
    groups: dict[str, set[str]] = {}
    for e in examples:
        groups.setdefault(find("id:" + question_id(e.qid)), set()).add(e.qid)
    return list(groups.values())


def held_out_ids(examples: Sequence[QAExample], fraction: float, source: str | None = None) -> set[str]:
    """Ids of the examples in the dev split: ``round(fraction x groups)`` question groups (at least one, and
    at least one left for training), those whose smallest normalised question text hashes lowest."""
    by_id = {e.qid: e for e in examples}
    groups = question_groups(examples)
    if len(groups) < 2:
        raise DataError(f"{len(groups)} distinct question(s): too few to hold out a dev split "
                        f"(model.dataset.dev_holdout_fraction={fraction})", source)
    n_dev = min(len(groups) - 1, max(1, round(fraction * len(groups))))

    def key(group: set[str]) -> str:
        text = min(_norm(by_id[q].question) for q in group)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    return set().union(*sorted(groups, key=key)[:n_dev])


def golden_from_answers(examples: Sequence[QAExample]) -> dict[str, list[list[str]]]:
    """A BioASQ golden map for held-out training questions: question id (``<qid>`` of ``<qid>_<NNN>``) ->
    one answer whose synonyms are the distinct answer texts of its snippets (each snippet's answer is the
    form of the factoid found in that snippet). Questions without an answer cannot be scored and are left out."""
    golden: dict[str, list[str]] = {}
    for e in examples:
        texts = golden.setdefault(question_id(e.qid), [])
        for a in e.answers:
            if a["text"] and a["text"].lower() not in {t.lower() for t in texts}:
                texts.append(a["text"])
    return {qid: [texts] for qid, texts in golden.items() if texts}

