"""Fixtures shared by the corpus tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sample_jsonl(tmp_path_factory) -> Path:
    """The bundled PubMed + PMC sample extracted to one JSONL (``data pubmed`` + ``data pmc``)."""
    from bio_megatron.corpus.pmc import extract_pmc
    from bio_megatron.corpus.pubmed import extract_pubmed
    from bio_megatron.corpus.samples import sample_files

    d = tmp_path_factory.mktemp("jsonl")
    extract_pubmed(sample_files()["pubmed"], d / "pubmed.jsonl")
    extract_pmc(sample_files()["pmc"], d / "pmc.jsonl")
    out = d / "all.jsonl"
    out.write_bytes((d / "pubmed.jsonl").read_bytes() + (d / "pmc.jsonl").read_bytes())
    return out
