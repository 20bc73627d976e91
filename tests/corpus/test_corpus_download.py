"""The NCBI downloader against a loopback HTTP server laid out like ftp.ncbi.nlm.nih.gov.

The server serves the real bundled PubMed files with NCBI-style ``.md5`` files and directory listings,
honours ``Range`` requests, and can be told to corrupt a file or to drop the connection mid-transfer.
"""

from __future__ import annotations

import hashlib
import http.server
import threading

import pytest

from bio_megatron.cli import main
from bio_megatron.corpus.download import download_pmc, download_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.utils.errors import DataError

GZ = [p for p in sample_files()["pubmed"] if p.name.endswith(".xml.gz")]


class _Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    drop_once: set[str]      # paths whose first full GET is cut off half-way
    corrupt: set[str]        # paths always served with a flipped byte (checksum mismatch)
    requests: list[tuple[str, str | None]]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        if self.path.endswith("/"):
            names = sorted(k[len(self.path):] for k in srv.files if k.startswith(self.path))
            body = "".join(f'<a href="{n}">{n}</a>\n' for n in names if "/" not in n).encode()
            return self._send(200, body)
        if self.path not in srv.files:
            return self._send(404, b"not found")
        data = srv.files[self.path]
        if self.path in srv.corrupt:
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
        payload = data[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.path in srv.drop_once and not rng:
            srv.drop_once.discard(self.path)
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)  # the connection drops with half the promised bytes sent
            return
        self.wfile.write(payload)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def ncbi():
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.files, srv.drop_once, srv.corrupt, srv.requests = {}, set(), set(), []
    for p in GZ:
        data = p.read_bytes()
        srv.files[f"/pubmed/baseline/{p.name}"] = data
        srv.files[f"/pubmed/baseline/{p.name}.md5"] = f"MD5({p.name})= {hashlib.md5(data).hexdigest()}\n".encode()
    pkg = GZ[0].read_bytes()  # stands in for a PMC bulk package: verified by full gunzip (no .md5)
    srv.files["/pub/pmc/oa_bulk/oa_comm/xml/oa_comm_xml.PMC000xxxxxx.baseline.2025-06-26.tar.gz"] = pkg
    srv.files["/pub/pmc/oa_bulk/oa_comm/xml/oa_comm_xml.PMC000xxxxxx.baseline.2025-06-26.filelist.csv"] = b"a,b\n"
    srv.files["/pub/pmc/oa_bulk/oa_noncomm/xml/oa_noncomm_xml.PMC000xxxxxx.baseline.2025-06-26.tar.gz"] = pkg
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_download_verifies_resumes_and_skips_present(ncbi, tmp_path):
    srv, url = ncbi
    dropped = f"/pubmed/baseline/{GZ[1].name}"
    srv.drop_once.add(dropped)
    res = download_pubmed(tmp_path, base_url=url, workers=2, backoff_s=0.01, timeout=5)
    assert res["downloaded"] == len(GZ) and res["failed"] == 0
    for p in GZ:
        assert (tmp_path / p.name).read_bytes() == p.read_bytes()
    assert not list(tmp_path.glob("*.part"))
    ranges = [r for path, r in srv.requests if path == dropped and r]
    assert ranges and int(ranges[0].split("=")[1].rstrip("-")) > 0  # resumed, not restarted
    srv.requests.clear()
    again = download_pubmed(tmp_path, base_url=url, limit=2, backoff_s=0.01)
    assert again["present"] == 2 and again["downloaded"] == 0
    assert not [p for p, _ in srv.requests if p.endswith(".xml.gz")]  # verified locally, not refetched


def test_checksum_mismatch_fails_clearly_after_retries(ncbi, tmp_path, capsys):
    srv, url = ncbi
    bad = GZ[0].name
    srv.corrupt.add(f"/pubmed/baseline/{bad}")
    with pytest.raises(DataError) as err:
        download_pubmed(tmp_path, base_url=url, retries=2, backoff_s=0.01)
    assert bad in str(err.value) and "MD5 mismatch" in str(err.value) and "1 of 3" in str(err.value)
    assert not (tmp_path / bad).exists() and not (tmp_path / f"{bad}.part").exists()
    assert all((tmp_path / p.name).is_file() for p in GZ[1:])  # the good files still landed
    rc = main(["data", "download", "pubmed", "--out", str(tmp_path), "--base-url", url, "--retries", "1"])
    assert rc != 0


def test_pmc_licence_group_selection(ncbi, tmp_path):
    srv, url = ncbi
    res = download_pmc(tmp_path, licence_groups=("oa_comm",), base_url=url)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "oa_comm_xml.PMC000xxxxxx.baseline.2025-06-26.filelist.csv",
        "oa_comm_xml.PMC000xxxxxx.baseline.2025-06-26.tar.gz"]
    assert res["downloaded"] == 2
    truncated = "/pub/pmc/oa_bulk/oa_noncomm/xml/oa_noncomm_xml.PMC000xxxxxx.baseline.2025-06-26.tar.gz"
    srv.files[truncated] = srv.files[truncated][:-200]  # no .md5 for PMC: a full gunzip must catch it
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        download_pmc(tmp_path / "nc", licence_groups=("oa_noncomm",), base_url=url, retries=1)
    with pytest.raises(DataError, match="unknown PMC licence group"):
        download_pmc(tmp_path, licence_groups=("cc0",), base_url=url)
