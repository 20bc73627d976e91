"""What an import draws for the modules a source lacks (an encoder without its MLM head; a BioELECTRA discriminator
without generator and discriminator head): ``init_weights(only=...)`` draws those modules alone, and they are the
same tensors a whole-model initialisation gives them (each value depends on its own key), with nothing under them
left undrawn. ``formats/ours.write_ours`` relies on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import run_world

ROOT = Path(__file__).resolve().parents[2]


def _drawn(recipe: str, prefixes: tuple[str, ...]) -> dict:
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.families import family_of_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.parallel.distributed import single_process

    single_process()
    m = load_pretrain_config(ROOT / "nemo_configs" / "pretrain" / recipe, [], 1).model
    got = {}
    for mode in ("whole", "only"):
        model = family_of_model(m).build_pretraining_model(m, 1000, torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(7.0)  # a value no initialisation draws
        init_weights(model, 5, m.init_method_std, m.shape().num_layers, only=prefixes if mode == "only" else None)
        state = model.state_dict()
        got[mode] = {k: v.clone() for k, v in state.items() if k.startswith(prefixes) and torch.is_tensor(v)}
        got[mode + "_outside"] = sum(int((v == 7.0).all()) for k, v in state.items()
                                     if torch.is_tensor(v) and v.numel() and not k.startswith(prefixes)
                                     and v.is_floating_point())
    return {"keys": sorted(got["whole"]), "equal": all(torch.equal(got["whole"][k], got["only"][k]) for k in got["whole"]),
            "undrawn": [k for k, v in got["only"].items() if v.numel() and bool((v == 7.0).all())],
            "outside_left": got["only_outside"]}


@pytest.mark.parametrize("recipe, prefixes", [("tiny.yaml", ("lm_head.", "output_layer.bias")),
                                              ("tiny_electra.yaml", ("generator.", "discriminator_head."))])
def test_only_the_missing_modules_are_drawn_as_a_whole_model_would_draw_them(recipe, prefixes):
    (got,) = run_world(1, _drawn, recipe, prefixes)
    assert got["keys"] and got["equal"] and not got["undrawn"], got
    assert got["outside_left"] > 0  # the encoder was not drawn: the source fills it
