"""The same tiny run (seed, data, several Adam steps, dropout off) under every parallel layout gives
the TP1 losses: tensor, pipeline (several micro-batches), TP2xPP2 and data parallelism, with and
without the distributed optimizer. Weights are initialised from global keys, so layouts start equal."""

from __future__ import annotations

import pytest
from harness import run_world

from engine.pretrain_runs import losses, overrides, pretrain_rank

LAYOUTS = {  # name: (world, tp, pp, distributed optimizer)
    "tp2": (2, 2, 1, False),
    "pp2": (2, 1, 2, False),
    "tp2pp2": (4, 2, 2, False),
    "dp2": (2, 1, 1, False),
    "dp2_distopt": (2, 1, 1, True),
}


@pytest.fixture(scope="module")
def reference(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "tp1", steps=3))
    ref = losses(root / "tp1")
    assert sorted(ref) == [1, 2, 3]
    return root, ref


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_tp1(name, reference, pubmed_prefix):
    root, ref = reference
    world, tp, pp, distopt = LAYOUTS[name]
    run_world(world, pretrain_rank, overrides(pubmed_prefix, root, name, tp=tp, pp=pp, distopt=distopt, steps=3))
    got = losses(root / name)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=1e-5), (name, step, got, ref)
    # The optimizer really moved the model: a run that did not train would repeat its first loss.
    assert abs(ref[3] - ref[1]) > 1e-3
