"""Untrusted corpus files: XML entities and archive member names cannot reach outside the input.

These held before issue 11 (found by hand); they are gathered here so that they stay true:
- an external entity (XXE) is never resolved: the file it names is not read into the corpus;
- nested entity expansion ("billion laughs") stops at once with a clear error, not after gigabytes;
- ``.tar.gz`` members named ``../x`` or ``/abs/x`` are read in memory, never extracted to disk.
Each case runs the real CLI, checks exit 2 and the message, and that nothing was written.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import pytest

from reliability.files import tree_digest
from bio_megatron.cli import main
from bio_megatron.corpus.samples import sample_files

SECRET = "SECRET-CONTENT-4711"
_ARTICLE = ('<PubmedArticleSet><PubmedArticle><MedlineCitation Status="MEDLINE" Owner="NLM">'
            '<PMID Version="1">1</PMID><Article><ArticleTitle>Aspirin {ref} here.</ArticleTitle><Abstract>'
            '<AbstractText>Aspirin inhibits platelets. It is {ref} used.</AbstractText></Abstract></Article>'
            '</MedlineCitation></PubmedArticle></PubmedArticleSet>\n')


def _run(argv: list[str], caplog) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level("ERROR", logger="bio_megatron"):
        rc = main(argv)
    return rc, " ".join(r.getMessage() for r in caplog.records)


@pytest.fixture
def logged(caplog):
    # The project logger does not propagate; attach pytest's handler to it for these tests.
    import logging

    from bio_megatron.utils.log import setup_logging

    setup_logging()  # configures (and clears) the project logger's handlers once: attach ours after that
    logger = logging.getLogger("bio_megatron")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def test_external_entity_is_not_resolved(tmp_path, logged):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    xml = tmp_path / "xxe.xml"
    xml.write_text(f'<?xml version="1.0"?>\n<!DOCTYPE PubmedArticleSet [ <!ENTITY xxe SYSTEM "file://{secret}"> ]>\n'
                   + _ARTICLE.format(ref="&xxe;"))
    before = tree_digest(tmp_path)
    out = tmp_path / "out" / "pubmed.jsonl"
    rc, msg = _run(["data", "pubmed", "--input", str(xml), "--output", str(out), "--workers", "1"], logged)
    assert rc == 2
    assert f"{xml}:3" in msg and "entity" in msg and SECRET not in msg
    assert not out.exists()
    assert tree_digest(tmp_path) == before


def test_billion_laughs_stops_at_once(tmp_path, logged):
    decl, prev = ['<!ENTITY lol0 "lol">'], "lol0"
    for i in range(1, 10):  # 10^9 "lol"s if expanded
        decl.append(f'<!ENTITY lol{i} "{("&" + prev + ";") * 10}">')
        prev = f"lol{i}"
    xml = tmp_path / "laughs.xml"
    xml.write_text('<?xml version="1.0"?>\n<!DOCTYPE PubmedArticleSet [\n' + "\n".join(decl) + "\n]>\n"
                   + _ARTICLE.format(ref=f"&{prev};"))
    out = tmp_path / "laughs.jsonl"
    t0 = time.perf_counter()
    rc, msg = _run(["data", "pubmed", "--input", str(xml), "--output", str(out), "--workers", "1"], logged)
    assert rc == 2 and str(xml) in msg and "amplification" in msg
    assert time.perf_counter() - t0 < 10  # expat's limit trips before any real expansion
    assert not out.exists()


def test_tar_member_names_never_escape(tmp_path, logged):
    """Members named ``../`` or absolute are parsed from memory; nothing is created outside (or inside)."""
    articles = [f.read_bytes() for f in sample_files()["pmc"]]  # three different real articles
    pkg = tmp_path / "pkg" / "oa_comm_xml.tar.gz"
    pkg.parent.mkdir()
    escape = tmp_path / "escaped.nxml"
    with tarfile.open(pkg, "w:gz") as tar:
        for name, article in zip(("../escaped.nxml", str(escape), "PMC0001/../../escaped.nxml"), articles):
            info = tarfile.TarInfo(name)
            info.size = len(article)
            tar.addfile(info, io.BytesIO(article))
        link = tarfile.TarInfo("PMC0001/link.nxml")  # a symlink member is not followed either
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    before = tree_digest(tmp_path)
    out = tmp_path / "out.jsonl"
    assert main(["data", "pmc", "--input", str(pkg), "--output", str(out), "--workers", "1"]) == 0
    docs = out.read_text(encoding="utf-8").splitlines()
    assert len(docs) == 3 and "root:" not in out.read_text(encoding="utf-8")
    assert not escape.exists()
    assert {k: v for k, v in tree_digest(tmp_path).items() if k != "out.jsonl"} == before
