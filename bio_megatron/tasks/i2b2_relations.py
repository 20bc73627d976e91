"""i2b2/VA 2010 relations in BLUE's TSV (``model.dataset.format: i2b2_2010`` of ``finetune re``), BioELECTRA's and
bio-lm's I2B2-2010-RE.

BLUE (``ncbi-nlp/BLUE_Benchmark``, ``blue/bert/create_i2b2_bert.py``) makes one example of every pair of concepts on
one line of a report: the two concepts replaced by ``@<type>$`` markers (``@problem$``, ``@test$``, ``@treatment$``;
overlapping concepts by one ``@<type1>-<type2>$``), labelled with the pair's relation from ``rel/*.rel`` or
``false``. It writes them with Python's ``csv`` writer, tab-delimited, after a header::

    index<TAB>sentence<TAB>label          e.g.  0001.l3.l5<TAB>He was given @treatment$ for @problem$ .<TAB>TrAP

(a sentence holding a double quote is csv-quoted; a pair with two relations is written once per relation, so an
index may repeat). Labels: :data:`I2B2_RE_LABELS`, ``false`` first (id 0) as ChemProt's negative class.

Metric (BLUE's ``eval_rel``): micro precision / recall / F1 over the eight relation types, ``false`` excluded
(:func:`bio_megatron.evaluation.chemprot.chemprot_scores` with these positives).
"""

from __future__ import annotations

import csv
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.clinical_spans import Mention
from bio_megatron.tasks.re_data import RelationExample
from bio_megatron.utils.errors import DataError

I2B2_RE_POSITIVES: tuple[str, ...] = ("PIP", "TeCP", "TeRP", "TrAP", "TrCP", "TrIP", "TrNAP", "TrWP")
NEGATIVE = "false"
I2B2_RE_LABELS: tuple[str, ...] = (NEGATIVE,) + I2B2_RE_POSITIVES
HEADER = ["index", "sentence", "label"]
EXPECTED = "BLUE's i2b2 2010 relation TSV: the header 'index<TAB>sentence<TAB>label', then one pair a line"


def read_i2b2_relations(path: str | Path) -> list[RelationExample]:
    """The examples of one BLUE i2b2 2010 relation file (csv-quoted fields unquoted)."""
    path = Path(path)
    out: list[RelationExample] = []
    header_seen = False
    for lineno, line in iter_lines(path, EXPECTED):
        if not line.strip():
            continue
        try:
            fields = next(csv.reader([line], delimiter="\t", strict=True))
        except csv.Error as exc:
            raise DataError(f"does not parse as a tab-separated csv row ({exc}); expected {EXPECTED}", str(path),
                            lineno) from None
        if not header_seen:
            if fields != HEADER:
                raise DataError(f"header {line[:60]!r}; expected {EXPECTED}", str(path), lineno)
            header_seen = True
            continue
        if len(fields) != 3:
            raise DataError(f"{len(fields)} tab-separated field(s); expected {EXPECTED}", str(path), lineno)
        index, sentence, label = fields
        if label not in I2B2_RE_LABELS:
            raise DataError(f"label {label[:40]!r} is not one of {list(I2B2_RE_LABELS)}", str(path), lineno)
        if "@" not in sentence or "$" not in sentence:
            raise DataError(f"sentence without BLUE's @<type>$ concept markers; expected {EXPECTED}", str(path),
                            lineno)
        out.append(RelationExample(sentence, label, f"{path}:{lineno} ({index})"))
    if not out:
        raise DataError(f"no examples; expected {EXPECTED}", str(path))
    return out


# --- from the release: BLUE's examples of every same-line concept pair ------------------------------------------
REL_LINE = 'c="<text>" L:T L:T||r="<type>"||c="<text>" L:T L:T'
_REL = re.compile(r'^c="(.*)" (\d+):(\d+) (\d+):(\d+)\|\|r="([^"]+)"\|\|c="(.*)" (\d+):(\d+) (\d+):(\d+)$')


@dataclass
class ReleaseCounts:
    documents: int = 0
    examples: int = 0
    relations: int = 0
    relations_not_on_one_line: int = 0
    """Gold relations whose concepts are on different lines: no example holds them (BLUE prints and drops them)."""


def _marked(line: str, offset: int, a: Mention, b: Mention) -> str:
    """The line with the two concepts replaced by BLUE's markers (one marker for overlapping concepts)."""
    s1, e1, s2, e2 = a.start - offset, a.end - offset, b.start - offset, b.end - offset
    if s1 <= s2 <= e1 or s1 <= e2 <= e1 or s2 <= s1 <= e2 or s2 <= e1 <= e2:  # BLUE's overlap test (touching too)
        return line[:min(s1, s2)] + f"@{a.type}-{b.type}$" + line[max(e1, e2):]
    (s1, e1, t1), (s2, e2, t2) = sorted([(s1, e1, a.type), (s2, e2, b.type)])
    return line[:s1] + f"@{t1}$" + line[e1:s2] + f"@{t2}$" + line[e2:]


def document_pairs(doc_id: str, txt: Path, con: Path, rel: Path, counts: ReleaseCounts) -> list[tuple[str, str, str]]:
    """``(index, sentence, label)`` rows of one report, in BLUE's order: concept pairs in ``.con`` order."""
    from bio_megatron.tasks.i2b2 import Positions, read_con

    text = "\n".join(line for _, line in iter_lines(txt, "i2b2 text, one sentence a line"))
    positions, concepts = Positions(text), read_con(con, text)
    names = [f"{con.name}.l{i}" for i in range(len(concepts))]  # BLUE's concept ids
    ids: dict[tuple[int, int], str] = {}
    for name, c in zip(names, concepts):
        ids.setdefault((c.start, c.end), name)  # a relation's argument is the first concept at its span (BLUE)
    relations: list[tuple[str, str, str]] = []
    for lineno, raw in iter_lines(rel, f"i2b2 2010 relation lines {REL_LINE}"):
        if not raw.strip():
            continue
        m = _REL.match(raw.strip())
        if not m:
            raise DataError(f"does not parse as a relation line {REL_LINE}: {raw.strip()[:80]!r}", str(rel), lineno)
        args = []
        for g in (1, 7):
            span = positions.span(m.group(g), *map(int, m.group(g + 1, g + 2, g + 3, g + 4)), rel, lineno)
            if span not in ids:
                raise DataError(f"argument {m.group(g)!r} is not a concept of {con.name}", str(rel), lineno)
            args.append(ids[span])
        if m.group(6) not in I2B2_RE_POSITIVES:
            raise DataError(f"relation {m.group(6)!r} is not one of {list(I2B2_RE_POSITIVES)}", str(rel), lineno)
        relations.append((args[0], args[1], m.group(6)))
    line_of = [text.count("\n", 0, c.start) for c in concepts]
    rows, used = [], set()
    for (i, a), (j, b) in itertools.combinations(enumerate(concepts), 2):
        if line_of[i] != line_of[j]:
            continue
        ia, ib, n = names[i], names[j], line_of[i]
        sentence = _marked(positions.lines[n], positions.starts[n], a, b)
        labels = [r for r in relations if {r[0], r[1]} == {ia, ib}]
        used.update(labels)
        for label in [r[2] for r in labels] or [NEGATIVE]:
            rows.append((f"{doc_id}.{ia}.{ib}", sentence, label))
    counts.documents += 1
    counts.examples += len(rows)
    counts.relations += sum(r[2] != NEGATIVE for r in rows)
    counts.relations_not_on_one_line += len(set(relations) - used)
    return rows


def write_relations(path: Path, rows: list[tuple[str, str, str]]) -> None:
    """BLUE's TSV: csv writer, tab-delimited, the header first."""
    from bio_megatron.utils.io import atomic_open

    with atomic_open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(rows)
