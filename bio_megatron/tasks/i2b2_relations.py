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
from pathlib import Path

from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.re_data import RelationExample
from bio_megatron.utils.errors import DataError

I2B2_RE_POSITIVES: tuple[str, ...] = ("PIP", "TeCP", "TeRP", "TrAP", "TrCP", "TrIP", "TrNAP", "TrWP")
I2B2_RE_LABELS: tuple[str, ...] = ("false",) + I2B2_RE_POSITIVES
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
