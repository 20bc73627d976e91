"""The real PubMed/PMC sample bundled with the package (see ``resources/corpus/SOURCES.md``)."""

from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "resources" / "corpus"


def sample_files() -> dict[str, list[Path]]:
    """``{"pubmed": [...], "pmc": [...]}``: bundled real NCBI files, PubMed in publication order."""
    pubmed = sorted(p for p in (SAMPLE_DIR / "pubmed").iterdir() if p.name.endswith((".xml", ".xml.gz")))
    pmc = sorted((SAMPLE_DIR / "pmc").glob("*.nxml"))
    return {"pubmed": pubmed, "pmc": pmc}
