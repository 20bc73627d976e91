"""Download PubMed baseline/update files and PMC open-access bulk packages from NCBI over HTTPS.

* the file list comes from NCBI's directory index pages (the same listing a browser shows);
* every PubMed file is checked against the ``.md5`` NCBI publishes beside it; files without one (PMC
  bulk packages) are checked by decompressing them completely, which catches truncation;
* interrupted transfers resume from the ``.part`` file with an HTTP ``Range`` request, dropped
  connections are retried with back-off, and a checksum mismatch re-downloads from scratch;
* files are fetched in parallel threads (I/O bound) and renamed into place only once verified, so a
  finished name is always a good file and a rerun skips it.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import re
import shutil
import socket
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bio_megatron.utils.errors import DataError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

NCBI_BASE_URL = "https://ftp.ncbi.nlm.nih.gov"
PUBMED_DIRS = {"baseline": "pubmed/baseline/", "updates": "pubmed/updatefiles/"}
# PMC OA bulk packages are split by licence group; the paper used the commercial-use subset.
PMC_LICENCE_GROUPS = ("oa_comm", "oa_noncomm", "oa_other")
_HREF = re.compile(r'href="([^"?/][^"]*)"', re.I)
_MD5 = re.compile(r"\b([0-9a-f]{32})\b", re.I)
_TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


@dataclass
class RemoteFile:
    url: str
    name: str
    md5_url: str | None = None
    sha256: str | None = None  # pinned digest (public datasets' table); checked instead of any .md5
    git_blob: str | None = None  # pinned git blob id, where that is all upstream publishes (no size, no sha256)


def _open(url: str, timeout: float, headers: dict[str, str] | None = None):
    req = urllib.request.Request(url, headers={"User-Agent": "bio-megatron", **(headers or {})})
    return urllib.request.urlopen(req, timeout=timeout)


def list_remote(index_url: str, pattern: str, timeout: float = 60.0) -> list[RemoteFile]:
    """Files in an NCBI directory listing whose names match ``pattern``, with their ``.md5`` if listed."""
    try:
        with _open(index_url, timeout) as resp:
            html = resp.read().decode("utf-8", "replace")
    except _TRANSIENT as exc:
        raise DataError(f"cannot list {index_url}: {exc}") from None
    names = sorted(set(_HREF.findall(html)))
    base = index_url if index_url.endswith("/") else index_url + "/"
    rx = re.compile(pattern)
    return [RemoteFile(base + n, n, base + n + ".md5" if n + ".md5" in names else None)
            for n in names if rx.fullmatch(n)]


def parse_md5(text: str, name: str) -> str:
    """The hex digest in an NCBI ``.md5`` file (``MD5(name)= hex`` or ``hex  name``)."""
    m = _MD5.search(text)
    if not m:
        raise DataError(f"no MD5 digest found in checksum file for {name}: {text[:80]!r}")
    return m.group(1).lower()


def _md5_of(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gzip_ok(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(1 << 22):
                pass
        return True
    except (EOFError, OSError, zlib.error):
        return False


def _digests_of(path: Path, sha256: bool, git_blob: bool) -> tuple[str | None, str | None]:
    """(sha256, git blob id) of ``path``, each only if asked, in one read. A blob id is git's SHA-1 over
    ``b"blob <size>\\0" + content`` (``git hash-object``): the content address a repository's tree pins."""
    h256 = hashlib.sha256() if sha256 else None
    blob = None
    if git_blob:
        blob = hashlib.sha1(f"blob {path.stat().st_size}\0".encode("ascii"), usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            if h256 is not None:
                h256.update(block)
            if blob is not None:
                blob.update(block)
    return (h256.hexdigest() if h256 else None), (blob.hexdigest() if blob else None)


def git_blob_id(path: str | Path) -> str:
    """``git hash-object path``, computed here (no git needed)."""
    return _digests_of(Path(path), False, True)[1]  # type: ignore[return-value]


def _verify(path: Path, md5: str | None, name: str, sha256: str | None = None,
            git_blob: str | None = None) -> str | None:
    """Why ``path`` (the download of ``name``) is not a good copy, or None."""
    if sha256 is not None or git_blob is not None:
        got256, got_blob = _digests_of(path, sha256 is not None, git_blob is not None)
        if sha256 is not None and got256 != sha256:
            return f"SHA256 mismatch (expected {sha256}, got {got256})"
        if git_blob is not None and got_blob != git_blob:
            return f"git blob id mismatch (expected {git_blob}, got {got_blob})"
        return None
    if md5 is not None:
        got = _md5_of(path)
        return None if got == md5 else f"MD5 mismatch (expected {md5}, got {got})"
    if name.endswith((".gz", ".tgz")) and not _gzip_ok(path):
        return "corrupt or truncated gzip data"
    return None


def download_file(remote: RemoteFile, out_dir: Path, retries: int = 4, timeout: float = 60.0,
                  backoff_s: float = 1.0) -> dict[str, Any]:
    """Fetch one file (resuming a ``.part``), verify it, rename it into place; return what happened."""
    dest = out_dir / remote.name
    md5 = None
    if remote.md5_url:
        for attempt in range(1, retries + 1):
            try:
                with _open(remote.md5_url, timeout) as resp:
                    md5 = parse_md5(resp.read().decode("utf-8", "replace"), remote.name)
                break
            except _TRANSIENT as exc:
                if attempt == retries:
                    raise DataError(f"cannot fetch checksum {remote.md5_url}: {exc}", str(dest)) from None
                time.sleep(backoff_s * attempt)
    if dest.is_file() and _verify(dest, md5, remote.name, remote.sha256, remote.git_blob) is None:
        return {"name": remote.name, "status": "present", "bytes": dest.stat().st_size}
    part = out_dir / (remote.name + ".part")
    last_error = ""
    for attempt in range(1, retries + 1):
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with _open(remote.url, timeout, headers) as resp:
                # 206: the server honoured Range, append; 200: it sent the whole file, start over.
                mode = "ab" if have and resp.status == 206 else "wb"
                expected = resp.headers.get("Content-Length")
                with open(part, mode) as fh:
                    shutil.copyfileobj(resp, fh, 1 << 20)
                got = part.stat().st_size - (have if mode == "ab" else 0)
                if expected is not None and got < int(expected):
                    # http.client returns a short body, not an error, when the peer closes early
                    raise ConnectionError(f"connection closed after {got} of {expected} bytes")
        except urllib.error.HTTPError as exc:
            if exc.code == 416:  # asked past the end: the .part is complete (or bad); verify below
                pass
            elif exc.code in (404, 403, 410):
                raise DataError(f"{remote.url}: HTTP {exc.code} {exc.reason}") from None
            else:
                last_error = f"HTTP {exc.code}"
                log.warning("%s: %s (attempt %d/%d), retrying", remote.name, last_error, attempt, retries)
                time.sleep(backoff_s * attempt)
                continue
        except _TRANSIENT as exc:
            last_error = f"connection error: {exc}"
            log.warning("%s: %s after %d bytes (attempt %d/%d), resuming", remote.name, last_error,
                        part.stat().st_size if part.exists() else 0, attempt, retries)
            time.sleep(backoff_s * attempt)
            continue
        why = _verify(part, md5, remote.name, remote.sha256, remote.git_blob)
        if why is None:
            part.replace(dest)
            return {"name": remote.name, "status": "downloaded", "bytes": dest.stat().st_size,
                    "attempts": attempt, "md5": md5}
        last_error = why
        log.warning("%s: %s (attempt %d/%d), downloading again", remote.name, why, attempt, retries)
        part.unlink(missing_ok=True)
    raise DataError(f"download failed after {retries} attempts: {last_error}", str(dest))


def download_all(remotes: list[RemoteFile], out_dir: str | Path, workers: int = 4,
                 **kwargs: Any) -> dict[str, Any]:
    """Download ``remotes`` in parallel; failures are collected and reported together at the end."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results, failures = [], []
    total_bytes = 0

    def one(r: RemoteFile):
        try:
            return download_file(r, out, **kwargs)
        except DataError as exc:
            return {"name": r.name, "status": "failed", "error": str(exc)}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, res in enumerate(pool.map(one, remotes), 1):
            results.append(res)
            total_bytes += res.get("bytes", 0)
            if res["status"] == "failed":
                failures.append(res["error"])
            el = time.perf_counter() - t0
            eta = el / i * (len(remotes) - i)
            log.info("download %d/%d %s [%s] (%.1f MB/s, ETA %.0fs)", i, len(remotes), res["name"],
                     res["status"], total_bytes / 1e6 / max(el, 1e-9), eta)
    summary = {"files": len(remotes), "downloaded": sum(r["status"] == "downloaded" for r in results),
               "present": sum(r["status"] == "present" for r in results), "failed": len(failures),
               "bytes": total_bytes, "seconds": round(time.perf_counter() - t0, 3), "out": str(out),
               "errors": failures}
    if failures:
        raise DataError(f"{len(failures)} of {len(remotes)} downloads failed:\n  " + "\n  ".join(failures))
    return summary


def download_pubmed(out_dir: str | Path, baseline: bool = True, updates: bool = False,
                    limit: int | None = None, base_url: str = NCBI_BASE_URL, **kwargs: Any) -> dict[str, Any]:
    """PubMed baseline and/or update files (``pubmedYYnNNNN.xml.gz``), each MD5-verified."""
    remotes: list[RemoteFile] = []
    for kind, wanted in (("baseline", baseline), ("updates", updates)):
        if wanted:
            found = list_remote(f"{base_url.rstrip('/')}/{PUBMED_DIRS[kind]}", r"pubmed\d+n\d+\.xml\.gz")
            if not found:
                raise DataError(f"no PubMed {kind} files listed at {base_url}/{PUBMED_DIRS[kind]}")
            remotes += found[:limit] if limit else found
    if not remotes:
        raise DataError("nothing to download: choose --baseline and/or --updates")
    return download_all(remotes, out_dir, **kwargs)


def download_pmc(out_dir: str | Path, licence_groups: tuple[str, ...] = ("oa_comm",), limit: int | None = None,
                 base_url: str = NCBI_BASE_URL, **kwargs: Any) -> dict[str, Any]:
    """PMC OA bulk XML packages (``*.tar.gz`` with their ``.filelist.csv``) of the chosen licence groups."""
    remotes: list[RemoteFile] = []
    for group in licence_groups:
        if group not in PMC_LICENCE_GROUPS:
            raise DataError(f"unknown PMC licence group {group!r}; choose from {', '.join(PMC_LICENCE_GROUPS)}")
        found = list_remote(f"{base_url.rstrip('/')}/pub/pmc/oa_bulk/{group}/xml/",
                            rf"{group}_xml\..*\.(tar\.gz|filelist\.csv)")
        packages = [r for r in found if r.name.endswith(".tar.gz")][: limit or None]
        wanted = {p.name.removesuffix(".tar.gz") for p in packages}
        remotes += packages + [r for r in found if r.name.removesuffix(".filelist.csv") in wanted]
    if not remotes:
        raise DataError(f"no PMC bulk packages listed for {', '.join(licence_groups)} at {base_url}")
    return download_all(remotes, out_dir, **kwargs)
