"""PubMed baseline/update XML(.gz) -> JSON-lines documents (title + abstract, split into sentences).

PubMed publishes a yearly baseline and daily update files. A PMID may appear in several files (a
revised record is re-issued in a later update) and a later file may delete it (``<DeleteCitation>``).
The corpus must hold each PMID's latest record, unless a deletion came after it. We therefore:

1. parse every file once (in parallel) into a per-file shard of documents plus two int64 arrays:
   the PMIDs of its records and the PMIDs it deletes;
2. decide the winners with numpy (latest file wins, then the higher ``Version``; a deletion in file
   ``k`` removes records from files ``<= k``) -- about 16 bytes per PMID, so all of PubMed fits;
3. concatenate the shards in file order, keeping only winning records, into the output atomically.

Files are processed in the order given, which for NCBI's names (``pubmed26n1334`` < ``pubmed26n1335``)
is their publication order; the CLI sorts them.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bio_megatron.corpus.schema import Document
from bio_megatron.corpus.sentences import split_sentences, warm_up
from bio_megatron.corpus.xmlio import Progress, iter_elements, text_of
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file, disk_errors
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_SKIP_IN_TEXT = frozenset()  # inline markup (<i>, <sup>, <sub>) is kept as text


# A PMID (or Version) as NCBI writes them: 1 to 18 ASCII digits, no sign, not zero. ``str.isdigit`` also accepts
# "²" or Arabic-Indic digits (int() then fails or reads them) and lets a 40-digit PMID overflow the int64 arrays.
_ID = re.compile(r"0*[1-9][0-9]{0,17}")


def _number(text: str | None) -> int | None:
    """The positive integer of an identifier's text, or None when it is empty, not ASCII digits or too large."""
    text = (text or "").strip()
    return int(text) if _ID.fullmatch(text) else None


def _record_to_document(art, path: Path) -> tuple[Document | None, int, int, str | None]:
    """(document or None, pmid, version, why-dropped) of one ``<PubmedArticle>``. A record whose <PMID> or its
    ``Version`` is missing, empty, not a positive decimal number or too large is skipped (counted, reason listed),
    as any other malformed record: one odd record must not cost a whole baseline file."""
    pmid_el = art.find("MedlineCitation/PMID")
    if pmid_el is None:
        return None, -1, 0, "record without a <PMID>"
    pmid = _number(pmid_el.text)
    if pmid is None:
        return None, -1, 0, f"<PMID> {(pmid_el.text or '').strip()[:30]!r} is not a positive decimal number (1-18 digits)"
    version = _number(pmid_el.get("Version", "1") or "1")
    if version is None:
        return None, -1, 0, f"PMID {pmid}: Version {pmid_el.get('Version', '')[:30]!r} is not a positive decimal number"
    article = art.find("MedlineCitation/Article")
    title = text_of(article.find("ArticleTitle")) if article is not None else ""
    sections = []
    parts = article.findall("Abstract/AbstractText") if article is not None else []
    if not any((t.text or len(t)) for t in parts):
        # Some records carry only a publisher's/plain-language English abstract; it is still abstract text.
        parts = [t for o in art.findall("MedlineCitation/OtherAbstract") if o.get("Language", "eng") == "eng"
                 for t in o.findall("AbstractText")]
    for part in parts:
        text = text_of(part, _SKIP_IN_TEXT)
        if text:
            sections.append(text)  # structured abstracts: sections joined, labels dropped
    if not sections:
        return None, pmid, version, "empty abstract"
    sentences = split_sentences(title) if title else []
    for sec in sections:
        sentences.extend(split_sentences(sec))
    return Document(id=f"PMID:{pmid}", source="pubmed", title=title, sentences=sentences,
                    meta={"pmid": pmid, "version": version, "file": path.name}), pmid, version, None


def _parse_file(args: tuple[str, str]) -> dict[str, Any]:
    """Worker: one XML file -> shard JSONL + arrays of record PMIDs/versions and deleted PMIDs."""
    path, shard = Path(args[0]), args[1]
    pmids: list[int] = []
    versions: list[int] = []
    deleted: list[int] = []
    counts = {"records": 0, "empty_abstract": 0, "skipped": 0}
    problems: list[str] = []
    with open(shard, "w", encoding="utf-8") as out:
        for n, elem in enumerate(iter_elements(path, {"PubmedArticle", "DeleteCitation", "PubmedBookArticle"}), 1):
            if elem.tag == "DeleteCitation":
                ids = [_number(p.text) for p in elem.findall("PMID")]
                deleted.extend(i for i in ids if i is not None)
                if None in ids:
                    counts["skipped"] += ids.count(None)
                    if len(problems) < 20:
                        problems.append(f"{path}: <DeleteCitation> {n}: {ids.count(None)} <PMID>(s) that are not "
                                        "positive decimal numbers, ignored")
                continue
            if elem.tag != "PubmedArticle":
                continue
            counts["records"] += 1
            doc, pmid, version, why = _record_to_document(elem, path)
            if doc is None:
                key = "empty_abstract" if why == "empty abstract" else "skipped"
                counts[key] += 1
                if key == "skipped" and len(problems) < 20:
                    problems.append(f"{path}: record {n}: {why}")
                continue
            pmids.append(pmid)
            versions.append(version)
            out.write(doc.to_json() + "\n")
    return {"path": str(path), "shard": shard, "pmids": np.asarray(pmids, np.int64),
            "versions": np.asarray(versions, np.int64), "deleted": np.asarray(deleted, np.int64),
            "counts": counts, "problems": problems}


def _last_per_key(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Indices (into the unsorted arrays) of the last element of each key run in ``order``."""
    k = keys[order]
    last = np.ones(len(order), bool)
    last[:-1] = k[1:] != k[:-1]
    return order[last]


def _winners(results: list[dict[str, Any]]) -> list[np.ndarray]:
    """Per file, a boolean mask over its records: True where the record is the PMID's final state.

    The winner of a PMID is its highest ``Version``, and among equal versions the one in the latest
    file (then the last in that file). It is dropped when a ``<DeleteCitation>`` for the PMID occurs in
    the same or a later file: NCBI lists deletions at the end of a file, after its records.
    """
    rk = np.concatenate([r["pmids"] for r in results])
    rv = np.concatenate([r["versions"] for r in results])
    rf = np.concatenate([np.full(len(r["pmids"]), i, np.int64) for i, r in enumerate(results)])
    rp = np.concatenate([np.arange(len(r["pmids"]), dtype=np.int64) for r in results])
    win = _last_per_key(rk, np.lexsort((rp, rf, rv, rk)))
    dk = np.concatenate([r["deleted"] for r in results])
    df = np.concatenate([np.full(len(r["deleted"]), i, np.int64) for i, r in enumerate(results)])
    if len(dk):
        last_del = _last_per_key(dk, np.lexsort((df, dk)))
        del_keys, del_file = dk[last_del], df[last_del]  # sorted by key: the latest deleting file
        at = np.clip(np.searchsorted(del_keys, rk[win]), 0, len(del_keys) - 1)
        deleted = (del_keys[at] == rk[win]) & (del_file[at] >= rf[win])
        win = win[~deleted]
    keep = np.zeros(len(rk), bool)
    keep[win] = True  # records were concatenated file by file, so a split gives each file's mask
    return np.split(keep, np.cumsum([len(r["pmids"]) for r in results])[:-1])


def extract_pubmed(inputs: list[str | Path], output: str | Path, workers: int = 1,
                   **opts: Any) -> dict[str, Any]:
    """Extract title + abstract sentences from PubMed XML(.gz) files into one JSONL file.

    Returns statistics: files, records, documents written, empty abstracts dropped, superseded
    versions, deleted PMIDs, skipped records and the reasons, throughput. Raises ``DataError`` for a
    file that cannot be read at all (truncated gzip, malformed XML, not UTF-8, empty), and when not
    one record is usable (nothing is written then). ``<output>.lock`` keeps a second run off ``output``.
    """
    paths = [Path(p) for p in inputs]
    if not paths:
        raise DataError("no PubMed input files given")
    for path in paths:  # before any work: a FIFO, a loop or an unreadable file is named for what it is
        check_input_file(path, empty="empty file (0 bytes): an interrupted download?")
    with disk_errors(output), exclusive_lock(f"{output}.lock", f"output {output}"):
        return _extract_locked(paths, output, workers)


def _no_usable_record(paths: list[Path], results: list[dict[str, Any]], masks: list[np.ndarray]) -> DataError:
    """Zero documents would be an empty JSONL that looks like a finished extraction: say why instead."""
    c = {k: sum(r["counts"][k] for r in results) for k in ("records", "empty_abstract", "skipped")}
    problems = [p for r in results for p in r["problems"]][:3]
    return DataError(
        f"no usable PubMed record: {c['records']} <PubmedArticle> record(s), {c['empty_abstract']} with an "
        f"empty abstract, {c['skipped']} malformed, {sum(len(m) for m in masks)} superseded or deleted; "
        "expected PubMed XML with <PubmedArticle> records that have a <PMID> and an abstract"
        + ("; first problems: " + " | ".join(problems) if problems else ""), ", ".join(map(str, paths)))


def _extract_locked(paths: list[Path], output: str | Path, workers: int) -> dict[str, Any]:
    progress = Progress("pubmed files", total=len(paths))
    with tempfile.TemporaryDirectory(prefix=".pubmed-shards-", dir=Path(output).parent) as tmp:
        jobs = [(str(p), os.path.join(tmp, f"{i:06d}.jsonl")) for i, p in enumerate(paths)]
        results = []
        if workers > 1 and len(jobs) > 1:
            warm_up()  # forked workers inherit the loaded splitter instead of each importing NLTK
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for r in pool.map(_parse_file, jobs):
                    results.append(r)
                    progress.update(1)
        else:
            for job in jobs:
                results.append(_parse_file(job))
                progress.update(1)
        masks = _winners(results)
        if not any(m.any() for m in masks):
            raise _no_usable_record(paths, results, masks)
        written = sentences = 0
        with atomic_open(output, "w", encoding="utf-8") as out:
            for r, mask in zip(results, masks):
                with open(r["shard"], encoding="utf-8") as fh:
                    for keep, line in zip(mask, fh):
                        if keep:
                            out.write(line)
                            written += 1
                            sentences += len(json.loads(line)["sentences"])
    all_deleted = np.unique(np.concatenate([r["deleted"] for r in results])) if results else []
    stats = {
        "files": len(paths),
        "records": sum(r["counts"]["records"] for r in results),
        "documents": written,
        "sentences": sentences,
        "empty_abstracts_dropped": sum(r["counts"]["empty_abstract"] for r in results),
        "superseded_or_deleted": sum(len(m) - int(m.sum()) for m in masks),
        "delete_citations": int(len(all_deleted)),
        "skipped_records": sum(r["counts"]["skipped"] for r in results),
        "problems": [p for r in results for p in r["problems"]][:20],
        "seconds": round(progress.elapsed, 3),
        "docs_per_s": round(written / max(progress.elapsed, 1e-9), 1),
        "output": str(output),
    }
    log.info("pubmed: %d files, %d records -> %d documents (%d empty abstracts, %d superseded/deleted) "
             "in %.1fs", stats["files"], stats["records"], written, stats["empty_abstracts_dropped"],
             stats["superseded_or_deleted"], progress.elapsed)
    return stats
