"""DDI-2013 in BLURB's form, made from the corpus's XML release and BLURB's split index.

BLURB's DDI files are one line per candidate pair: ``pair id<TAB>sentence<TAB>label``, the sentence with both
drug mentions replaced by ``@DRUG$`` (a pair whose mentions overlap by one ``@DRUG-DRUG$``), line breaks inside
it turned into spaces, and the label ``DDI-<type>`` for an interaction or ``DDI-false``. The split index
(``{train,dev,test}_files.tsv``, one XML file of the release a line) says which documents each split holds, in
order; within a document, sentences and pairs keep the release's order, and a mention is its outer span (the
first to the last character of a discontinuous one). Written from that description; the output equals BLURB's
dev.tsv and test.tsv byte for byte (tests/corpus/test_dataset_download.py).

The archive is read into memory, never extracted to disk, and only after its sha256 was verified.
"""

from __future__ import annotations

import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.io import atomic_open

ARCHIVE = "original_DDIextraction_2013.tar.gz"
SPLITS = ("train", "dev", "test")


def _outer_span(offsets: str, where: str) -> tuple[int, int]:
    """``"12-20"`` or ``"3-7;15-20"`` (inclusive ends) -> ``(first, last + 1)``."""
    try:
        parts = [tuple(int(x) for x in p.split("-")) for p in offsets.split(";")]
        return min(a for a, _ in parts), max(b for _, b in parts) + 1
    except ValueError:
        raise DataError(f"charOffset {offsets!r} is not start-end[;start-end...]", where) from None


def pair_lines(xml: bytes, where: str) -> list[str]:
    """BLURB's lines for the pairs of one document of the release."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise DataError(f"XML parse error: {exc}", where) from None
    out = []
    for sentence in root.iter("sentence"):
        text = sentence.get("text", "")
        spans = {e.get("id"): _outer_span(e.get("charOffset", ""), where) for e in sentence.iter("entity")}
        for pair in sentence.iter("pair"):
            try:
                (a1, b1), (a2, b2) = sorted((spans[pair.get("e1")], spans[pair.get("e2")]))
            except KeyError as exc:
                raise DataError(f"pair {pair.get('id')} names entity {exc.args[0]!r}, not in its sentence",
                                where) from None
            if a2 < b1:  # the two mentions overlap: one marker for both
                marked = text[:a1] + "@DRUG-DRUG$" + text[max(b1, b2):]
            else:
                marked = text[:a1] + "@DRUG$" + text[b1:a2] + "@DRUG$" + text[b2:]
            marked = marked.replace("\r", " ").replace("\n", " ")
            label = f"DDI-{pair.get('type')}" if pair.get("ddi") == "true" else "DDI-false"
            out.append(f"{pair.get('id')}\t{marked}\t{label}\n")
    return out


def write_ddi_splits(folder: str | Path) -> list[Path]:
    """``<folder>/{train,dev,test}.tsv`` from ``<folder>``'s archive and split index (atomically); their paths.
    Every name of the index is checked before anything is written."""
    folder = Path(folder)
    with tarfile.open(folder / ARCHIVE, "r:gz") as tar:
        # read once in archive order (a gzip stream cannot seek back cheaply), keyed by the path below the archive's
        # top folder, as the split index names them; the release is a few MB of XML
        documents = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar if m.isfile() and "/" in m.name}
    index = {}
    for split in SPLITS:
        path = folder / f"{split}_files.tsv"
        index[split] = path.read_text(encoding="utf-8").splitlines()
        for lineno, name in enumerate(index[split], 1):
            if name not in documents:
                raise DataError(f"{name!r} is not a file of {ARCHIVE}", str(path), lineno)
    written = []
    for split, names in index.items():
        lines = [line for name in names for line in pair_lines(documents[name], f"{folder / ARCHIVE}:{name}")]
        if not lines:
            raise DataError(f"no pair in the documents {split}_files.tsv lists", str(folder / f"{split}_files.tsv"))
        path = folder / f"{split}.tsv"
        with atomic_open(path, "w", encoding="utf-8", newline="") as fh:
            fh.writelines(lines)
        written.append(path)
    return written
