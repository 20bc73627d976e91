"""i2b2 2012 temporal events and i2b2/UTHealth 2014 de-identification (``model.dataset.format: i2b2_2012 |
i2b2_2014`` of ``finetune ner``): XML documents with character offsets -> IOB.

A document (both releases)::

    <?xml version="1.0" encoding="UTF-8" ?>
    <ClinicalNarrativeTemporalAnnotation>          (2014: <deIdi2b2>)
    <TEXT><![CDATA[ ...the record... ]]></TEXT>
    <TAGS>
    <EVENT id="E0" start="18" end="27" text="ADMISSION" modality="FACTUAL" polarity="POS" type="OCCURRENCE" />
    <TIMEX3 .../> <TLINK .../> <SECTIME .../>      (2014: <NAME id="P0" start=".." end=".." text=".." TYPE="PATIENT" />,
    </TAGS>                                          <DATE ... TYPE="DATE" />, <LOCATION ... TYPE="HOSPITAL" />, ...)

``start``/``end`` are 0-based character offsets into the CDATA text, end exclusive (newlines count one). What
becomes a mention, as bio-lm (``preprocess_i2b2_2012_ner.py``, ``..._2014_ner.py``): 2012, every ``EVENT`` typed by
its ``type`` (TREATMENT, PROBLEM, TEST, CLINICAL_DEPT, EVIDENTIAL, OCCURRENCE; TIMEX3 and links are not NER
targets there); 2014, every element of ``TAGS`` typed by its ``TYPE`` (the PHI subtype: PATIENT, DOCTOR, DATE,
...). The tags are read line by line (a bare ``&`` in some 2012 files breaks an XML parser; bio-lm works around
it the same way), so an offset outside the text is named by file and line. A ``text`` attribute that differs from
the text at its offsets is counted and warned about, not refused: bio-lm reads the test sets without the check
because their released files have such slips (2014's ``180-03.xml`` and ``188-05.xml``).

Splits, as :mod:`bio_megatron.tasks.i2b2`: a folder of ``*.xml`` under ``data_dir`` (the test release's, say), or
``train``/``dev`` of the unpacked training release (:data:`RELEASES`), a patient-level 90/10 split (2012: a file is
a patient; 2014: ``<patient>-<record>.xml``, a patient's records together).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Iterable

import numpy as np

from bio_megatron.corpus.iob import Sentence
from bio_megatron.tasks.clinical_spans import Mention, SpanStats, label_text, patient_split, resolve_overlaps
from bio_megatron.tasks.i2b2 import chosen_sentences
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

RELEASES = {
    "i2b2_2012": {"train": ["2012-07-15.original-annotation.release"],
                  "test": "2012-08-08.test-data.event-timex-groundtruth/xml"},
    "i2b2_2014": {"train": ["training-PHI-Gold-Set1", "training-PHI-Gold-Set2"], "test": "testing-PHI-Gold-fixed"},
}
# (which TAGS elements are mentions, the attribute holding the type)
_MENTIONS = {"i2b2_2012": ({"EVENT"}, "type"), "i2b2_2014": (None, "TYPE")}
_START, _END = "<TEXT><![CDATA[", "]]></TEXT>"
_ELEMENT = re.compile(r"<([A-Za-z_][\w.-]*)((?:\s+[\w.-]+\s*=\s*\"[^\"]*\")*)\s*/?>")
_ATTR = re.compile(r"([\w.-]+)\s*=\s*\"([^\"]*)\"")


def _norm(s: str) -> str:
    return " ".join(html.unescape(s).split())


def read_xml_document(path: Path, fmt: str, allowed: set[str] | None,
                      stats: SpanStats) -> list[Sentence]:
    """IOB sentences of one 2012/2014 XML document (see the module docstring)."""
    check_input_file(path, "i2b2 XML document")
    try:
        raw = path.read_text(encoding="utf-8")  # universal newlines: \r\n is one character, as the offsets count
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text (byte {exc.start}); expected an i2b2 XML document", str(path)) from None
    a, b = raw.find(_START), raw.find(_END)
    if a < 0 or b < a:
        raise DataError(f"no {_START}...{_END} in this file; expected an i2b2 {fmt[-4:]} XML document", str(path))
    text = raw[a + len(_START):b]
    tags_at = raw.find("<TAGS>", b)
    tags_end = raw.find("</TAGS>", tags_at)
    if tags_at < 0 or tags_end < 0:
        raise DataError("no <TAGS>...</TAGS> after the text", str(path), raw.count("\n", 0, b) + 1)
    names, type_key = _MENTIONS[fmt]
    mentions: list[Mention] = []
    mismatches: list[tuple[int, str, str]] = []
    pos = raw.find("<", tags_at + len("<TAGS>"), tags_end)
    while pos >= 0:
        lineno = raw.count("\n", 0, pos) + 1
        m = _ELEMENT.match(raw, pos, tags_end)
        if m is None and not raw.startswith("</", pos):  # never skip a tag we cannot read: it may be a mention
            raise DataError(f"does not parse as a tag <NAME attribute=\"value\" ... />: {raw[pos:pos + 60]!r}",
                            str(path), lineno)
        pos = raw.find("<", pos + 1, tags_end)
        if m is None or (names is not None and m.group(1) not in names):
            continue
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group(2))}
        label = attrs.get(type_key, "").strip()
        if not label:
            continue  # bio-lm skips an event without a type
        if not (attrs.get("start", "").isdigit() and attrs.get("end", "").isdigit()):
            raise DataError(f"<{m.group(1)}> needs integer start and end attributes (got start="
                            f"{attrs.get('start')!r}, end={attrs.get('end')!r})", str(path), lineno)
        start, end = int(attrs["start"]), int(attrs["end"])
        if not start < end <= len(text):
            raise DataError(f"offsets {start}-{end} are outside the text ({len(text)} characters) or empty",
                            str(path), lineno)
        if allowed is not None and f"B-{label}" not in allowed:
            raise DataError(f"{type_key} {label!r} is not in the label set {sorted(allowed)}", str(path), lineno)
        if "text" in attrs and _norm(attrs["text"]) != _norm(text[start:end]):
            mismatches.append((lineno, attrs["text"], text[start:end]))
        mentions.append(Mention(start, end, label, str(path), lineno))
    if mismatches:
        stats.text_mismatches += len(mismatches)
        (lineno, said, found), n = mismatches[0], len(mismatches)
        log.warning("%s:%d: text %r differs from the text at its offsets (%r); kept, as bio-lm does (%d in this "
                    "file)", path, lineno, said[:60], found[:60], n)
    return label_text(text, resolve_overlaps(mentions, stats), stats)


def _patient(fmt: str, path: Path) -> str:
    return path.stem.split("-")[0] if fmt == "i2b2_2014" else path.stem


def _read_folder(folder: Path, fmt: str, allowed: set[str] | None, stats: SpanStats) -> dict[str, list[Sentence]]:
    if not folder.is_dir():
        raise DataError(f"folder not found (an {fmt} split is a folder of .xml documents)", str(folder))
    files = sorted(folder.glob("*.xml"))
    if not files:
        raise DataError("no .xml documents in this folder", str(folder))
    return {str(p): read_xml_document(p, fmt, allowed, stats) for p in files}


def read_i2b2_xml(fmt: str, data_dir: str | Path, name: str, labels: Iterable[str] | None = None,
                  stats: SpanStats | None = None) -> list[Sentence]:
    """Sentences of one split of a 2012/2014 release, or of a folder of XML documents."""
    root, allowed, stats = Path(data_dir), set(labels) if labels is not None else None, stats or SpanStats()
    if name in ("train", "dev"):
        docs: dict[str, list[Sentence]] = {}
        for folder in RELEASES[fmt]["train"]:
            docs.update(_read_folder(root / folder, fmt, allowed, stats))
        by_patient: dict[str, list[str]] = {}
        for doc in docs:
            by_patient.setdefault(_patient(fmt, Path(doc)), []).append(doc)
        train, dev = patient_split(by_patient, np.random.RandomState(1))
        chosen = [d for p in (train if name == "train" else dev) for d in sorted(by_patient[p])]
    else:
        docs = _read_folder(root / name, fmt, allowed, stats)
        chosen = sorted(docs)
    return chosen_sentences(fmt.replace("_", " "), name, docs, chosen, stats)
