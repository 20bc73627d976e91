"""Shared fixtures. torch and megatron-core are imported once here, so that every forked gloo world
starts in well under a second instead of paying the ~6 s import per process."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", module=r"megatron(\..*)?")

import torch  # noqa: E402,F401
import megatron.core  # noqa: E402,F401  (import cost paid once, before any fork)
from megatron.core.models.bert import bert_model  # noqa: E402,F401


@pytest.fixture(scope="session")
def pubmed_prefix(tmp_path_factory) -> Path:
    """Indexed pretraining data built by the real corpus pipeline from the bundled PubMed/PMC sample."""
    from bio_megatron.demo import build_demo_corpus

    return build_demo_corpus(tmp_path_factory.mktemp("corpus"))
