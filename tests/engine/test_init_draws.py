"""The layout-invariant initialisation (``models/init.py``) by its definition, and at its cost: every parameter is
its slice of the one draw of its global key, and each key is drawn once. A layer stack's parameters share one
global key of shape [layers, ...]; drawing that key once per layer made initialisation num_layers times slower
(57 s for 345m on a 2-core CPU, over three minutes for 1.2b on the lent H200's host: the GPU check's memory step
timed out in it, 2026-11-26)."""

from __future__ import annotations

from pathlib import Path

from harness import run_world

ROOT = Path(__file__).resolve().parents[2]


def _draws(recipe: str) -> dict:
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.families import family_of_model
    from bio_megatron.models import init
    from bio_megatron.parallel.distributed import single_process

    single_process()
    m = load_pretrain_config(ROOT / "nemo_configs" / "pretrain" / recipe, [], 1).model
    model = family_of_model(m).build_pretraining_model(m, 1000, torch.float32)
    drawn: list[str] = []
    plain = init.init_value

    def counted(key: str, *args, **kwargs) -> torch.Tensor:
        drawn.append(key)
        return plain(key, *args, **kwargs)

    init.init_value = counted  # this forked rank's own module: the count of draws per key
    try:
        init.init_weights(model, 5, m.init_method_std, m.shape().num_layers)
    finally:
        init.init_value = plain
    pieces = list(init._sharded_tensors(model))
    mismatched = [sh.key for _, sh in pieces if not torch.equal(
        sh.data, plain(sh.key, tuple(sh.global_shape), 5, m.init_method_std, m.shape().num_layers)
        [sh.global_slice()].reshape(sh.local_shape))]
    return {"layers": m.shape().num_layers, "pieces": len(pieces), "keys": len({sh.key for _, sh in pieces}),
            "drawn": len(drawn), "distinct_drawn": len(set(drawn)), "mismatched": mismatched}


def test_each_parameter_is_its_slice_of_one_draw_per_global_key():
    (got,) = run_world(1, _draws, "tiny.yaml")
    assert got["layers"] >= 2 and got["pieces"] > got["keys"], got  # stacked layers: several pieces share a key
    assert got["drawn"] == got["distinct_drawn"] == got["keys"], got
    assert not got["mismatched"], got
