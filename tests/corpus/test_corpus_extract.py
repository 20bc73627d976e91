"""PubMed/PMC extraction on the bundled real NCBI sample: versions, deletions, licences, bad input."""

from __future__ import annotations

import contextlib
import gzip
import logging
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bio_megatron.cli import main
from bio_megatron.corpus.pmc import extract_pmc
from bio_megatron.corpus.pubmed import extract_pubmed
from bio_megatron.corpus.samples import sample_files
from bio_megatron.utils.errors import DataError

SAMPLE = sample_files()
BASELINE = next(p for p in SAMPLE["pubmed"] if p.name == "pubmed26n1334.xml.gz")


def _docs(path: Path) -> dict[str, dict]:
    return {d["id"]: d for d in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def _articles(path: Path) -> list[ET.Element]:
    """Records of a real PubMed file that have an abstract (so that each becomes a document)."""
    return [a for a in ET.fromstring(gzip.decompress(path.read_bytes())).findall("PubmedArticle")
            if a.find("MedlineCitation/Article/Abstract/AbstractText") is not None]


def test_pubmed_sample_matches_an_independent_parse(tmp_path):
    stats = extract_pubmed(SAMPLE["pubmed"], tmp_path / "pm.jsonl", workers=2)
    docs = _docs(tmp_path / "pm.jsonl")
    # Outside truth: every article with non-empty <AbstractText> in the files, parsed with plain ElementTree.
    expected = {}
    for f in SAMPLE["pubmed"]:
        raw = f.read_bytes()
        root = ET.fromstring(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        for art in root.findall("PubmedArticle"):
            own = art.findall("MedlineCitation/Article/Abstract/AbstractText")
            other = art.findall("MedlineCitation/OtherAbstract[@Language='eng']/AbstractText")
            texts = ["".join(t.itertext()).strip() for t in (own or other)]
            if any(texts):
                expected[f"PMID:{art.findtext('MedlineCitation/PMID')}"] = " ".join(texts)
    assert set(docs) == set(expected)
    assert stats["documents"] == len(expected) and stats["empty_abstracts_dropped"] > 0
    for doc_id, doc in docs.items():
        assert doc["source"] == "pubmed" and doc["sentences"][0].startswith(doc["title"][:20])
        got = "".join("".join(doc["sentences"]).split())
        assert got == "".join((doc["title"] + expected[doc_id]).split())  # nothing lost or invented


def test_latest_version_wins_and_delete_citation_across_files(tmp_path):
    arts = _articles(BASELINE)
    revised, deleted, readded = arts[0], arts[1], arts[2]
    pm = [a.findtext("MedlineCitation/PMID") for a in (revised, deleted, readded)]
    abstract = revised.find("MedlineCitation/Article/Abstract")
    for child in list(abstract):
        abstract.remove(child)
    ET.SubElement(abstract, "AbstractText").text = "Revised abstract text of the update file."

    def update_file(name: str, records: list[ET.Element], deletions: list[str]) -> Path:
        root = ET.Element("PubmedArticleSet")
        root.extend(records)
        if deletions:
            dc = ET.SubElement(root, "DeleteCitation")
            for p in deletions:
                ET.SubElement(dc, "PMID", Version="1").text = p
        path = tmp_path / name
        path.write_bytes(gzip.compress(ET.tostring(root)))
        return path

    # update 1 revises one record and deletes two; update 2 brings one of the deleted back.
    up1 = update_file("pubmed26n9001.xml.gz", [revised], [pm[1], pm[2]])
    up2 = update_file("pubmed26n9002.xml.gz", [readded], [])
    stats = extract_pubmed([BASELINE, up1, up2], tmp_path / "pm.jsonl")
    docs = _docs(tmp_path / "pm.jsonl")
    assert docs[f"PMID:{pm[0]}"]["sentences"][1:] == ["Revised abstract text of the update file."]
    assert f"PMID:{pm[1]}" not in docs
    assert f"PMID:{pm[2]}" in docs and docs[f"PMID:{pm[2]}"]["meta"]["file"] == up2.name
    assert list(docs).count(f"PMID:{pm[0]}") == 1
    assert stats["superseded_or_deleted"] == 3  # old pm0, old pm2 (re-added later), pm1
    # A higher Version of a PMID beats a lower one whatever the file order.
    v2 = ET.fromstring(ET.tostring(arts[3]))
    v2.find("MedlineCitation/PMID").set("Version", "2")
    v2.find(".//AbstractText").text = "Version two."
    old = update_file("pubmed26n9003.xml.gz", [ET.fromstring(ET.tostring(arts[3]))], [])
    extract_pubmed([update_file("a.xml.gz", [v2], []), old], tmp_path / "v.jsonl")
    assert _docs(tmp_path / "v.jsonl")[f"PMID:{arts[3].findtext('MedlineCitation/PMID')}"]["sentences"][-1] \
        == "Version two."


def test_pmc_body_only_with_licence(tmp_path):
    stats = extract_pmc(SAMPLE["pmc"], tmp_path / "pmc.jsonl", workers=1)
    docs = _docs(tmp_path / "pmc.jsonl")
    assert {d["licence"] for d in docs.values()} == {"CC BY", "public domain"}
    assert stats["documents"] == len(SAMPLE["pmc"])
    for f in SAMPLE["pmc"]:
        root = ET.parse(f).getroot()
        doc = docs["PMC" + root.findtext("front/article-meta/article-id[@pub-id-type='pmc']")]
        text = " ".join(doc["sentences"])
        # reference titles and table cells are not running text and must not leak in
        for ref in root.iter("article-title"):
            t = " ".join("".join(ref.itertext()).split())
            if len(t) > 40 and t != doc["title"]:
                assert t not in text
        for td in root.iter("td"):
            t = " ".join("".join(td.itertext()).split())
            if len(t) > 40:
                assert t not in text
        assert "[]" not in text and "Competing interests" not in text
    only_cc0 = extract_pmc(SAMPLE["pmc"], tmp_path / "cc0.jsonl", licences=["CC0"])
    assert only_cc0["documents"] == 0 and only_cc0["skipped_licence"] == len(SAMPLE["pmc"])


@contextlib.contextmanager
def _logged():
    """Records of the project logger (it does not propagate to the root logger pytest watches)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("bio_megatron")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _broken_variants(tmp_path: Path) -> dict[str, Path]:
    raw = BASELINE.read_bytes()
    xml = gzip.decompress(raw)
    cut = xml.index(b"</AbstractText>", len(xml) // 2)
    out = {
        "truncated": (tmp_path / "truncated.xml.gz", raw[: len(raw) // 2]),
        "malformed": (tmp_path / "malformed.xml", xml[:cut] + xml[cut + 3:]),
        "not_utf8": (tmp_path / "latin1.xml", xml[:cut] + b"\xe9" + xml[cut:]),
        "empty": (tmp_path / "empty.xml.gz", b""),
    }
    for path, data in out.values():
        path.write_bytes(data)
    return {k: v[0] for k, v in out.items()}


@pytest.mark.parametrize("case,needle", [("truncated", "truncated gzip"), ("malformed", "XML parse error"),
                                         ("not_utf8", "UTF-8"), ("empty", "empty file")])
def test_bad_pubmed_input_is_a_clear_fatal_error(tmp_path, case, needle):
    bad = _broken_variants(tmp_path)[case]
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError) as err:
        extract_pubmed([BASELINE, bad], out)
    assert str(bad) in str(err.value) and needle in str(err.value)
    if case in ("malformed", "not_utf8"):
        assert err.value.line is not None and err.value.line > 1
    assert not out.exists()  # nothing half-written under the final name
    with _logged() as records:
        assert main(["data", "pubmed", "--input", str(bad), "--output", str(out), "--workers", "1"]) != 0
    assert any(str(bad) in r.getMessage() and r.levelname == "ERROR" for r in records)


def test_bad_pmc_article_is_skipped_and_reported(tmp_path):
    bad = tmp_path / "broken.nxml"
    bad.write_bytes(SAMPLE["pmc"][0].read_bytes()[:5000])
    stats = extract_pmc([*SAMPLE["pmc"], bad], tmp_path / "pmc.jsonl")
    assert stats["skipped_bad"] == 1 and str(bad) in stats["problems"][0]
    assert stats["documents"] == len(SAMPLE["pmc"])
    with pytest.raises(DataError, match="broken.nxml"):
        extract_pmc([bad], tmp_path / "strict.jsonl", skip_bad=False)


def test_pmc_bulk_tar_gz_equals_loose_files(tmp_path):
    """NCBI ships PMC as .tar.gz packages; reading one must give exactly what the loose files give."""
    import tarfile

    pkg = tmp_path / "oa_comm_xml.PMC000xxxxxx.baseline.2025-06-26.tar.gz"
    with tarfile.open(pkg, "w:gz") as tar:
        for f in SAMPLE["pmc"]:
            tar.add(f, arcname=f"PMC000xxxxxx/{f.name}")
    extract_pmc([pkg], tmp_path / "tar.jsonl", workers=2)
    extract_pmc(SAMPLE["pmc"], tmp_path / "files.jsonl")
    strip = lambda d: {k: {**v, "meta": {**v["meta"], "file": Path(v["meta"]["file"]).name}} for k, v in d.items()}
    assert strip(_docs(tmp_path / "tar.jsonl")) == strip(_docs(tmp_path / "files.jsonl"))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(pkg.read_bytes()[: pkg.stat().st_size // 2])
    with pytest.raises(DataError, match="cut.tar.gz: corrupt or truncated archive"):
        extract_pmc([cut], tmp_path / "cut.jsonl")
