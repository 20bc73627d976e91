"""The tiny teacher every distillation test reads (pretrained once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distill_runs import make_teacher


@pytest.fixture(scope="session")
def distill_teacher(pubmed_prefix, tmp_path_factory) -> Path:
    return make_teacher(pubmed_prefix, tmp_path_factory.mktemp("teacher"))
