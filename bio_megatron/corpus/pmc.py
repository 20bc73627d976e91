"""PMC open-access JATS (``.nxml``) -> JSON-lines documents: title + body paragraphs in reading order.

Tables, figures, captions, formulas, footnotes, supplementary material and the reference list are
left out (they are not running text and would teach the model table-cell fragments); citation
markers (``<xref ref-type="bibr">``) are dropped from paragraphs. Each document records its licence
so that a corpus can be restricted to commercially usable articles, as the paper did (CC0/CC BY).

Inputs may be ``.nxml`` files, directories of them, or NCBI's bulk ``.tar.gz`` packages.
"""

from __future__ import annotations

import contextlib
import gzip
from collections import deque
import json
import os
import re
import tarfile
import tempfile
import xml.etree.ElementTree as ET
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from bio_megatron.corpus.schema import Document
from bio_megatron.corpus.sentences import split_sentences, warm_up
from bio_megatron.corpus.xmlio import Progress, text_of
from bio_megatron.utils.errors import DataError
from bio_megatron.utils.input_files import check_input_file, disk_errors
from bio_megatron.utils.io import atomic_open
from bio_megatron.utils.lock import exclusive_lock
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

# Block elements that are not running text: skipped with everything inside them.
_SKIP_BLOCKS = frozenset({"table-wrap", "table", "fig", "fig-group", "caption", "disp-formula",
                          "supplementary-material", "fn-group", "fn", "ref-list", "ack", "app-group",
                          "glossary", "boxed-text", "media", "graphic", "table-wrap-foot", "label",
                          "notes", "sec-meta"})
# Inline elements removed from a paragraph's text.
_SKIP_INLINE = frozenset({"disp-formula", "inline-formula", "table-wrap", "fig", "graphic", "media",
                          "supplementary-material", "fn", "inline-graphic"})
# Back-matter sections some publishers (BMC) put inside <body>: boilerplate, not science.
_BOILERPLATE_SECTIONS = re.compile(
    r"^(competing interests?|conflicts? of interests?|authors'? contributions?|author contributions?|"
    r"acknowledge?ments?|funding|pre-publication history|abbreviations|supplementary (material|information)|"
    r"data availability|ethics statement)\b", re.I)
# What citation markers leave behind once removed: "[]", "[-]", "(, )", " –." and " ." spacing.
_EMPTY_BRACKETS = re.compile(r"\s*[\[(][\s,;–\-]*[\])]")
_DANGLING_DASH = re.compile(r"\s+[–-]+(?=[.,;:]|$)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:])(?=\s|$)")
COMMERCIAL_LICENCES = frozenset({"CC0", "CC BY", "CC BY-SA", "CC BY-ND", "public domain"})


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def detect_licence(root: ET.Element) -> str:
    """Normalised licence name (``CC0``, ``CC BY``, ``CC BY-NC-ND``, ``public domain``, ``unknown``)."""
    hrefs, texts = [], []
    for el in root.iter():
        name = _local(el.tag)
        if name == "license":
            hrefs += [v for k, v in el.attrib.items() if _local(k) in ("href", "resource")]
            if el.get("license-type"):
                hrefs.append(el.get("license-type"))
            texts.append(text_of(el))
        elif name in ("copyright-statement", "license_ref"):
            texts.append(text_of(el))
            if name == "license_ref":
                hrefs.append(el.text or "")
    for href in hrefs:
        h = href.lower()
        if "publicdomain/zero" in h or h.strip() == "cc0":
            return "CC0"
        if "creativecommons.org/licenses/" in h:
            kind = h.split("/licenses/", 1)[1].split("/", 1)[0]
            return "CC " + kind.upper()
        if "publicdomain/mark" in h or h == "public-domain":
            return "public domain"
    blob = " ".join(texts).lower()
    if "public domain" in blob:
        return "public domain"
    if "creative commons" in blob:
        nc = "noncommercial" in blob or "non-commercial" in blob
        nd = "noderivative" in blob or "no derivative" in blob
        return "CC BY" + ("-NC" if nc else "") + ("-ND" if nd else "")
    return "unknown"


def _paragraphs(elem: ET.Element) -> Iterator[str]:
    """Paragraph texts of a ``<body>`` in document order, skipping non-text blocks."""
    for child in elem:
        name = _local(child.tag)
        if name in _SKIP_BLOCKS:
            continue
        if name == "sec" and _BOILERPLATE_SECTIONS.match(text_of(child.find("title"))):
            continue
        if name == "p":
            # drop bibliography citation markers ("[12]") but keep cross references to e.g. genes
            for x in list(child.iter()):
                for sub in list(x):
                    if _local(sub.tag) == "xref" and sub.get("ref-type") == "bibr":
                        sub.text = ""
                        for inner in list(sub):
                            sub.remove(inner)
            text = text_of(child, _SKIP_INLINE)
            text = _SPACE_BEFORE_PUNCT.sub(r"\1", _DANGLING_DASH.sub("", _EMPTY_BRACKETS.sub("", text)))
            if text:
                yield text
        else:
            yield from _paragraphs(child)


def article_to_document(data: bytes, name: str) -> Document:
    """Parse one JATS article; raises ``DataError`` naming ``name`` when it is unusable."""
    if not data.strip():
        raise DataError("empty file (0 bytes)", name)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        raise DataError(f"XML parse error: {exc} (malformed XML or a byte that is not valid UTF-8)",
                        name, line) from None
    meta = root.find("front/article-meta")
    pmcid = None
    for aid in (meta.findall("article-id") if meta is not None else []):
        if aid.get("pub-id-type") in ("pmc", "pmcid") and aid.text:
            pmcid = aid.text.strip()
            break
    doc_id = (pmcid if pmcid.upper().startswith("PMC") else f"PMC{pmcid}") if pmcid else Path(name).stem
    title = text_of(meta.find("title-group/article-title")) if meta is not None else ""
    body = root.find("body")
    sentences = split_sentences(title) if title else []
    for para in (_paragraphs(body) if body is not None else []):
        sentences.extend(split_sentences(para))
    return Document(id=doc_id, source="pmc", title=title, licence=detect_licence(root),
                    sentences=sentences, meta={"file": Path(name).name, "has_body": body is not None})


def _iter_articles(inputs: Iterable[str | Path]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every article in files, directories and ``.tar.gz`` bulk packages."""
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            yield from _iter_articles(sorted(q for q in p.rglob("*") if q.suffix in (".nxml", ".xml")
                                             or q.name.endswith(".tar.gz")))
        elif p.name.endswith((".tar.gz", ".tgz", ".tar")):
            check_input_file(p)  # a FIFO, a symlink loop or an unreadable file, named as what it is
            try:
                with tarfile.open(p, "r:*") as tar:
                    for member in tar:
                        if member.isfile() and member.name.endswith((".nxml", ".xml")):
                            yield f"{p}!{member.name}", tar.extractfile(member).read()
            except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
                raise DataError(f"corrupt or truncated archive ({exc})", str(p)) from None
        elif os.path.lexists(p):
            data = check_input_file(p, empty=None).read_bytes()
            if data[:2] == b"\x1f\x8b":
                try:
                    data = gzip.decompress(data)
                except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                    raise DataError(f"corrupt or truncated gzip stream ({exc})", str(p)) from None
            yield str(p), data
        else:
            raise DataError("input file not found", str(p))


def _parse(item: tuple[str, bytes]) -> tuple[str, str | None, str | None]:
    name, data = item
    try:
        return name, article_to_document(data, name).to_json(), None
    except DataError as exc:
        return name, None, str(exc)


def _bounded_map(pool: ProcessPoolExecutor, items: Iterator[tuple[str, bytes]],
                 window: int) -> Iterator[tuple[str, str | None, str | None]]:
    """``pool.map`` in input order, but with at most ``window`` articles in flight: ``Executor.map``
    would read a whole multi-GB bulk package into memory before returning the first result."""
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(_parse, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


@contextlib.contextmanager
def _scratch(folder: Path) -> Iterator[IO[str]]:
    """A temporary text file in ``folder``, removed however the block ends. (``NamedTemporaryFile`` leaves its
    file behind when closing it fails, as the final flush does on a full disk.)"""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".pmc-", suffix=".jsonl")
    try:
        fh = open(fd, "w+", encoding="utf-8")
        try:
            yield fh
        except BaseException:
            with contextlib.suppress(OSError):  # the block's own error (e.g. ENOSPC) is the one to report
                fh.close()
            raise
        fh.close()
    finally:
        os.unlink(name)


def extract_pmc(inputs: list[str | Path] | str | Path, output: str | Path, workers: int = 1,
                licences: Iterable[str] | None = None, skip_bad: bool = True, **opts: Any) -> dict[str, Any]:
    """Extract PMC articles into one JSONL file; later duplicates of an article id replace earlier ones.

    ``licences``: keep only articles whose detected licence is in this set (``None`` keeps all;
    ``"commercial"`` stands for CC0 / CC BY / CC BY-SA / CC BY-ND / public domain). A malformed
    article is skipped and reported when ``skip_bad`` (a bulk package may hold a few broken files);
    otherwise it is fatal. No usable article at all is fatal too (nothing is written then), and
    ``<output>.lock`` keeps a second run off ``output``.
    """
    inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    with disk_errors(output), exclusive_lock(f"{output}.lock", f"output {output}"):
        return _extract_locked(inputs, output, workers, licences, skip_bad)


def _no_usable_article(inputs: list[str | Path], stats: dict[str, Any]) -> DataError:
    """Zero documents would be an empty JSONL that looks like a finished extraction: say why instead."""
    where = ", ".join(map(str, inputs))
    if stats["articles"] == 0:
        return DataError("no PMC articles (.nxml/.xml or .tar.gz) found in the inputs", where)
    found = ", ".join(f"{k}: {v}" for k, v in sorted(stats["licences"].items()))
    problems = stats["problems"][:3]
    return DataError(
        f"no usable PMC article among {stats['articles']}: {stats['skipped_bad']} malformed, "
        f"{stats['skipped_no_text']} without body text (licences found: {found or 'none'}); "
        "expected JATS articles with <body> paragraphs"
        + ("; first problems: " + " | ".join(problems) if problems else ""), where)


def _extract_locked(inputs: list[str | Path], output: str | Path, workers: int,
                    licences: Iterable[str] | None, skip_bad: bool) -> dict[str, Any]:
    allowed: set[str] | None = None
    if licences is not None:
        allowed = set()
        for lic in licences:
            allowed |= COMMERCIAL_LICENCES if lic == "commercial" else {lic}
    stats: dict[str, Any] = {"articles": 0, "documents": 0, "sentences": 0, "skipped_licence": 0,
                             "skipped_no_text": 0, "skipped_bad": 0, "duplicates": 0, "licences": {},
                             "problems": []}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    progress = Progress("pmc articles")
    with _scratch(Path(output).parent) as tmp:
        ids: list[str] = []
        if workers > 1:
            warm_up()  # forked workers inherit the loaded splitter instead of each importing NLTK
        pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
        try:
            results = _bounded_map(pool, _iter_articles(inputs), 8 * workers) if pool else map(
                _parse, _iter_articles(inputs))
            for name, line, err in results:
                stats["articles"] += 1
                progress.update(1)
                if err is not None:
                    if not skip_bad:
                        raise DataError(err.split(": ", 1)[-1], name)
                    stats["skipped_bad"] += 1
                    if len(stats["problems"]) < 20:
                        stats["problems"].append(err)
                    log.warning("skipping article: %s", err)
                    continue
                doc = json.loads(line)
                stats["licences"][doc["licence"]] = stats["licences"].get(doc["licence"], 0) + 1
                if allowed is not None and doc["licence"] not in allowed:
                    stats["skipped_licence"] += 1
                    continue
                if not doc["sentences"][1 if doc["title"] else 0:]:
                    stats["skipped_no_text"] += 1  # abstract-only deposits have no body text
                    continue
                ids.append(doc["id"])
                tmp.write(line + "\n")
        finally:
            if pool:
                pool.shutdown()
        if not ids and not stats["skipped_licence"]:
            # Only the user's own licence filter may legitimately leave nothing (a package without CC0).
            raise _no_usable_article(inputs, stats)
        if not ids:
            log.warning("pmc: the licence filter %s kept none of %d articles (found %s)", sorted(allowed or ()),
                        stats["articles"], stats["licences"])
        last = {doc_id: i for i, doc_id in enumerate(ids)}
        stats["duplicates"] = len(ids) - len(last)
        tmp.seek(0)
        with atomic_open(output, "w", encoding="utf-8") as out:
            for i, (doc_id, line) in enumerate(zip(ids, tmp)):
                if last[doc_id] == i:
                    out.write(line)
                    stats["documents"] += 1
                    stats["sentences"] += len(json.loads(line)["sentences"])
    stats["seconds"] = round(progress.elapsed, 3)
    stats["docs_per_s"] = round(stats["articles"] / max(progress.elapsed, 1e-9), 1)
    stats["output"] = str(output)
    log.info("pmc: %d articles -> %d documents (%d licence-filtered, %d bad) in %.1fs", stats["articles"],
             stats["documents"], stats["skipped_licence"], stats["skipped_bad"], progress.elapsed)
    return stats
