"""The pretraining checkpoint the Megatron-LM and NeMo interchange tests convert: made once per session (both
modules only read it; what they write goes to their own tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import overrides, pretrain_rank


@pytest.fixture(scope="session")
def ours(tmp_path_factory, pubmed_prefix) -> Path:
    """A tiny BERT with NSP head pretrained 2 steps at TP2 x PP2 (what the Megatron-LM and .nemo files come from)."""
    root = tmp_path_factory.mktemp("interchange_pt")
    run_world(4, pretrain_rank, overrides(pubmed_prefix, root, "tp2pp2", tp=2, pp=2, steps=2, save_last=True,
                                          extra=("model.bert_binary_head=true",)))
    return root / "tp2pp2" / "checkpoints"
