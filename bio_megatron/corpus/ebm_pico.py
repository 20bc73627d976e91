"""EBM-PICO as BLURB distributes it, checked after download: each split holds exactly the abstracts its index lists.

BLURB's ``{train,dev,test}.tsv`` are ``-DOCSTART- (PMID)`` lines, each followed by sentences of ``token<TAB>tag``
lines (a blank line between sentences), tags ``I-PAR``, ``I-INT``, ``I-OUT`` or ``O``; BLURB's split index
``{train,dev,test}_pmid.tsv`` is one line of comma-separated PMIDs. train.tsv is pinned by its git blob id only
(the one pin upstream's tree gives for it), so this check is what says the bytes are BLURB's split in BLURB's
format: the PMIDs of each split's ``-DOCSTART-`` lines are exactly its index's, once each, and every token line
has a tag of the four. Nothing is written; the files are streamed (train is ~10 MB).
"""

from __future__ import annotations

from pathlib import Path

from bio_megatron.evaluation.blurb import PICO_TAGS
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.utils.errors import DataError

SPLITS = ("train", "dev", "test")
DOCSTART = "-DOCSTART-"
EXPECTED = f"'{DOCSTART} (PMID)' lines, each followed by 'token<TAB>tag' sentences, tags {', '.join(PICO_TAGS)}"


def read_index(path: Path) -> dict[str, int]:
    """PMID -> line of a ``*_pmid.tsv`` (one line of comma-separated PMIDs); a repeated or non-numeric PMID is
    refused with its line."""
    listed: dict[str, int] = {}
    expected = "one line of comma-separated PMIDs"
    for lineno, line in iter_lines(path, expected):
        for item in filter(None, (i.strip() for i in line.split(","))):
            if not item.isdigit():
                raise DataError(f"{item[:40]!r} is not a PMID; expected {expected}", str(path), lineno)
            if item in listed:
                raise DataError(f"PMID {item} listed twice", str(path), lineno)
            listed[item] = lineno
    if not listed:
        raise DataError(f"no PMID; expected {expected}", str(path))
    return listed


def document_pmids(path: Path) -> dict[str, int]:
    """PMID -> line of each ``-DOCSTART- (PMID)`` of a split file, every token line's tag checked on the way."""
    found: dict[str, int] = {}
    for lineno, line in iter_lines(path, EXPECTED):
        if line.startswith(DOCSTART):
            rest = line[len(DOCSTART):].strip()
            pmid = rest[1:-1] if rest.startswith("(") and rest.endswith(")") else ""
            if not pmid.isdigit():
                raise DataError(f"{line[:60]!r} names no PMID; expected {EXPECTED}", str(path), lineno)
            if pmid in found:
                raise DataError(f"document {pmid} occurs twice (first on line {found[pmid]})", str(path), lineno)
            found[pmid] = lineno
        elif line.strip():
            if not found:
                raise DataError(f"a token before the first {DOCSTART} line; expected {EXPECTED}", str(path), lineno)
            token, sep, tag = line.rpartition("\t")
            if not sep or not token.strip() or tag not in PICO_TAGS:
                raise DataError(f"{line[:60]!r} is not token<TAB>tag with a tag of {', '.join(PICO_TAGS)}",
                                str(path), lineno)
    if not found:
        raise DataError(f"no document; expected {EXPECTED}", str(path))
    return found


def check_split(path: Path, index: Path) -> int:
    """Refuse ``path`` unless its documents are exactly those ``index`` lists; the number of documents."""
    found, listed = document_pmids(path), read_index(index)
    extra = [(pmid, line) for pmid, line in found.items() if pmid not in listed]
    if extra:
        raise DataError(f"document {extra[0][0]} is not in {index.name} ({len(extra)} such)", str(path), extra[0][1])
    absent = [pmid for pmid in listed if pmid not in found]
    if absent:
        more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
        raise DataError(f"PMID {absent[0]}{more} of {index.name} has no document in {path.name}", str(index),
                        listed[absent[0]])
    return len(found)


def check_ebm_pico(folder: str | Path) -> dict[str, int]:
    """Check ``<folder>/{split}.tsv`` against ``<folder>/{split}_pmid.tsv`` for the three splits; documents per
    split."""
    folder = Path(folder)
    return {split: check_split(folder / f"{split}.tsv", folder / f"{split}_pmid.tsv") for split in SPLITS}
