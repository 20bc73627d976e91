"""ShARe/CLEF eHealth 2013 Task 1 disorder mentions (``model.dataset.format: share_clefe`` of ``finetune ner``), the
BLUE / BioELECTRA clinical NER task, read from the release as unpacked.

A report is a MIMIC-II note ``<name>.txt``; its disorders are a pipe file, one mention a line, character offsets
into the report (end exclusive), a discontiguous mention listing one ``start||end`` pair per fragment::

    <name>.txt||Disease_Disorder||<CUI or CUI-less>||<start>||<end>[||<start>||<end> ...]

as the test gold (``Task1Gold_SN2012/Gold_SN2012/<name>.txt``) ships and BLUE writes the training gold from its
Knowtator XML (``Task1TrainSetGOLD199knowtatorehost/Task1Gold/<name>.txt``; BLUE's ``create_clefe_bert.py``). Where
there is no pipe file the release's Knowtator file is read (``.../ALLSAVED/<name>.knowtator.xml``: each
``<annotation>`` with its ``<span start end>`` fragments), so the release runs as shipped.

Done as BLUE does it: the report's de-identification marks ``[**...**]`` become ``PATTERN`` right-aligned in the
same width (spaces where the mark is shorter than the word), ``||||``, ``___`` and ``~~`` become spaces, so offsets
still hold; tags are untyped ``B``/``I``/``O``; a discontiguous mention is ``B`` on its first fragment's first word
and ``I`` on every other word of its fragments, the words between them ``O`` (:mod:`clinical_spans`). Ours: a line
is a sentence (BLUE splits sentences with its own tokenizer), and a report without a pipe file is refused (BLUE
prints a line and leaves the report out).

Splits: a folder of reports under ``data_dir`` (each report's pipe file is looked up in :data:`GOLD_DIRS`, in
order), or ``train`` / ``dev`` of ``Task1TrainSetCorpus199/ALLREPORTS``: the reports listed in
``<data_dir>/devel_docids.txt`` (BLUE's development list, one report name a line) are dev, the rest train; without
that file a seeded 90/10 split of the reports (:func:`clinical_spans.patient_split`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np

from bio_megatron.corpus.iob import Sentence
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.clinical_spans import Mention, SpanStats, label_text, patient_split, resolve_overlaps
from bio_megatron.tasks.i2b2 import chosen_sentences
from bio_megatron.utils.errors import DataError

TRAIN_REPORTS = "Task1TrainSetCorpus199/ALLREPORTS"
TEST_REPORTS = "Task1TestSetCorpus100/ALLREPORTS"
GOLD_DIRS = ("Task1TrainSetGOLD199knowtatorehost/Task1Gold", "Task1TrainSetGOLD199pipe", "Task1Gold_SN2012/Gold_SN2012")
KNOWTATOR_DIR = "Task1TrainSetGOLD199knowtatorehost/ALLSAVED"  # the training gold as released: Knowtator XML
DEV_IDS = "devel_docids.txt"
PIPE = "<report>||Disease_Disorder||<CUI>||<start>||<end>[||<start>||<end> ...]"
_MARK = re.compile(r"\[\*\*.*?\*\*\]")
_RULE = re.compile(r"\|{4}|___|~~")
_SPAN_TAG = re.compile(r"<span[\s/>]")


def mask_report(text: str) -> str:
    """BLUE's masking of a report, every replacement as wide as what it replaces."""
    text = _MARK.sub(lambda m: "PATTERN".rjust(len(m.group(0))) if len(m.group(0)) >= 7 else " " * len(m.group(0)),
                     text)
    return _RULE.sub(lambda m: " " * len(m.group(0)), text)


def read_pipe(path: Path, text: str, allowed: set[str] | None) -> list[Mention]:
    """The mentions of one pipe file, each fragment a :class:`Mention` (later fragments ``continues``)."""
    out: list[Mention] = []
    if allowed is not None and "B" not in allowed:
        raise DataError(f"ShARe/CLEFE's tags B, I, O are not the label set {sorted(allowed)}", str(path))
    for lineno, line in iter_lines(path, f"ShARe/CLEFE pipe lines {PIPE}"):
        if not line.strip():
            continue
        fields = line.strip().split("||")
        offsets = fields[3:]
        if len(fields) < 5 or len(offsets) % 2 or not all(f.strip().isdigit() for f in offsets):
            raise DataError(f"does not parse as a pipe line {PIPE}: {line.strip()[:80]!r}", str(path), lineno)
        for i in range(0, len(offsets), 2):
            start, end = int(offsets[i]), int(offsets[i + 1])
            if not start < end <= len(text):
                raise DataError(f"fragment {start}-{end} is outside the report ({len(text)} characters) or empty",
                                str(path), lineno)
            out.append(Mention(start, end, "", str(path), lineno, continues=i > 0))
    return out


def read_knowtator(path: Path, text: str) -> list[Mention]:
    """The mentions of one Knowtator file (``<report>.knowtator.xml``): every ``<annotation>``'s ``<span>``s, the
    first a mention's start and the others its later fragments, as BLUE's ``convert_train_gs_to_text`` reads them."""
    import xml.etree.ElementTree as ET

    try:
        tree = ET.parse(path)
    except ET.ParseError as exc:
        raise DataError(f"not well-formed Knowtator XML ({exc})", str(path), exc.position[0]) from None
    raw, pos = path.read_text(encoding="utf-8", errors="replace"), 0
    out: list[Mention] = []
    for k, annotation in enumerate(tree.getroot().iter("annotation"), 1):
        for i, span in enumerate(annotation.findall("span")):
            start, end = span.get("start", ""), span.get("end", "")
            tag = _SPAN_TAG.search(raw, pos)  # the element tree keeps no line numbers: the tag, in document order
            pos, lineno = (tag.end(), raw.count("\n", 0, tag.start()) + 1) if tag else (pos, None)
            if not (start.isdigit() and end.isdigit()) or not int(start) < int(end) <= len(text):
                raise DataError(f"annotation {k}: span {start!r}-{end!r} is not inside the report ({len(text)} "
                                "characters)", str(path), lineno)
            out.append(Mention(int(start), int(end), "", str(path), lineno, continues=i > 0))
    return out


def _mentions(root: Path, report: Path, text: str, allowed: set[str] | None) -> list[Mention]:
    """The report's mentions from its pipe file (:data:`GOLD_DIRS`, in order), else its Knowtator file."""
    for folder in GOLD_DIRS:
        for name in (report.name, f"{report.stem}.pipe.txt"):
            if (root / folder / name).is_file():
                return read_pipe(root / folder / name, text, allowed)
    knowtator = root / KNOWTATOR_DIR / f"{report.stem}.knowtator.xml"
    if knowtator.is_file():
        return read_knowtator(knowtator, text)
    raise DataError(f"no annotations for this report: no pipe file in {', '.join(GOLD_DIRS)} and no "
                    f"{KNOWTATOR_DIR}/{report.stem}.knowtator.xml under {root}", str(report))


def read_reports(root: Path, folder: Path, allowed: set[str] | None, stats: SpanStats) -> dict[str, list[Sentence]]:
    """``{report name: sentences}`` of a folder of reports."""
    if not folder.is_dir():
        raise DataError("folder not found (a ShARe/CLEFE split is a folder of reports)", str(folder))
    reports = sorted(folder.glob("*.txt"))
    if not reports:
        raise DataError("no .txt reports in this folder", str(folder))
    docs = {}
    for report in reports:
        text = mask_report("\n".join(line for _, line in iter_lines(report, "a ShARe/CLEFE report")))
        mentions = _mentions(root, report, text, allowed)
        docs[report.stem] = label_text(text, resolve_overlaps(mentions, stats), stats)
    return docs


def read_share_clefe(data_dir: str | Path, name: str, labels: Iterable[str] | None = None,
                     stats: SpanStats | None = None) -> list[Sentence]:
    """Sentences of one split (see the module docstring)."""
    root, allowed, stats = Path(data_dir), set(labels) if labels is not None else None, stats or SpanStats()
    if name in ("train", "dev"):
        docs = read_reports(root, root / TRAIN_REPORTS, allowed, stats)
        if (root / DEV_IDS).is_file():
            listed = {line.strip().removesuffix(".txt") for _, line in iter_lines(root / DEV_IDS, "report names")
                      if line.strip()}
            unknown = sorted(listed - set(docs))
            if unknown:
                raise DataError(f"lists reports that {TRAIN_REPORTS} does not hold: {unknown[:3]}", str(root / DEV_IDS))
            train, dev = sorted(set(docs) - listed), sorted(listed)
        else:
            train, dev = patient_split(docs, np.random.RandomState(1))
        chosen = train if name == "train" else dev
    else:
        docs = read_reports(root, root / name, allowed, stats)
        chosen = sorted(docs)
    return chosen_sentences("ShARe/CLEFE", name, docs, chosen, stats)
