"""BLURB's word-tagging files: EBM PICO and JNLPBA, ``token<TAB>tag`` sentences grouped into documents.

Each document starts with a ``-DOCSTART- <PMID>`` line (EBM PICO writes ``-DOCSTART- (PMID)``), sentences
are separated by blank lines. EBM PICO tags are ``I-PAR``, ``I-INT``, ``I-OUT`` and ``O`` (no ``B-``);
BLURB's JNLPBA is untyped ``B``/``I``/``O``. The token lines are read by the project's one IOB reader,
:func:`bio_megatron.tasks.ner_data.read_iob` (which ends a sentence at ``-DOCSTART-``); this module adds
the documents around its sentences.

A PMID may occur twice in a file (GENIA repeats three abstracts in JNLPBA train/test): the later
documents get the ids ``PMID#2``, ``PMID#3``, so every document id is unique.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

from bio_megatron.evaluation.blurb import JNLPBA_TAGS, PICO_TAGS
from bio_megatron.evaluation.inputs import iter_lines
from bio_megatron.tasks.blurb_data import check_documents
from bio_megatron.tasks.ner_data import Sentence, read_iob
from bio_megatron.utils.errors import DataError

DOCSTART = "-DOCSTART-"  # the marker read_iob also recognises


@dataclass
class TaggedDocument:
    """One abstract: ``id`` (unique in its file), ``pmid`` as written, its ``-DOCSTART-`` line, sentences."""

    id: str
    pmid: str
    line: int
    sentences: list[Sentence] = field(default_factory=list)


def _pmid(line: str, ordinal: int) -> str:
    rest = line.split()[1:]
    pmid = rest[0].strip("()") if rest else ""
    return pmid if pmid and pmid not in ("O", "-X-") else f"doc{ordinal}"  # a bare marker: number it


def read_docstart_iob(path: str | Path, tags: Collection[str]) -> list[TaggedDocument]:
    """Documents of a ``-DOCSTART-`` IOB file whose tags must be among ``tags``.

    The sentences are :func:`read_iob`'s (it ends a sentence at a ``-DOCSTART-`` line and checks every token
    line); a first pass over the lines, splitting sentences the same way, says which document owns each.
    """
    expected = f"'{DOCSTART} <PMID>' lines, each followed by 'token<TAB>tag' sentences, tags {sorted(tags)}"
    docs: list[TaggedDocument] = []
    owner: list[int] = []  # document index of each sentence, in the order read_iob returns them
    seen: dict[str, int] = {}
    in_sentence = False
    for lineno, line in iter_lines(path, expected):  # also refuses a binary or non-UTF-8 file, naming the line
        if line.startswith(DOCSTART):
            pmid = _pmid(line, len(docs) + 1)
            seen[pmid] = seen.get(pmid, 0) + 1
            docs.append(TaggedDocument(pmid if seen[pmid] == 1 else f"{pmid}#{seen[pmid]}", pmid, lineno))
            in_sentence = False
        elif not line.strip():
            in_sentence = False
        elif not in_sentence:
            if not docs:
                raise DataError(f"a token before the first '{DOCSTART}' line; expected {expected}", str(path), lineno)
            owner.append(len(docs) - 1)
            in_sentence = True
    sentences = read_iob(path, tags)
    if len(sentences) != len(owner):  # read_iob and the loop above must agree on what a sentence is
        raise DataError(f"read {len(sentences)} sentences but counted {len(owner)}; expected {expected}", str(path))
    for doc_index, sentence in zip(owner, sentences):
        docs[doc_index].sentences.append(sentence)
    empty = next((d for d in docs if not d.sentences), None)
    if empty is not None:
        raise DataError(f"document {empty.id} has no token; expected {expected}", str(path), empty.line)
    if not docs:
        raise DataError(f"no document; expected {expected}", str(path))
    return docs


def read_ebm_pico(path: str | Path, pmids: str | Path | None = None) -> list[TaggedDocument]:
    """EBM PICO (BLURB's ``dev.tsv``/``test.tsv``); ``pmids`` (``*_pmid.tsv``) checks the document set."""
    docs = read_docstart_iob(path, PICO_TAGS)
    if pmids is not None:
        check_documents({d.pmid: d.line for d in docs}, path, pmids)
    return docs


def read_jnlpba(path: str | Path) -> list[TaggedDocument]:
    """BLURB's untyped JNLPBA (``B``/``I``/``O``)."""
    return read_docstart_iob(path, JNLPBA_TAGS)


def sentences_of(docs: Collection[TaggedDocument]) -> list[Sentence]:
    """All sentences in file order: what the NER head trains and predicts on."""
    return [s for d in docs for s in d.sentences]
