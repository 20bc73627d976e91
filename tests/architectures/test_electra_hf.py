"""Outside oracle for ELECTRA: a random tiny Hugging Face ``ElectraForPreTraining`` + ``ElectraForMaskedLM`` pair
with one shared embedding (E == H = 64, generator G = 32) imported with ``import hf --generator --verify`` gives
transformers' discriminator and generator logits at TP1 and, resharded by dist-checkpointing, at TP2 (padded
batch, real positions compared); ``export hf`` writes two folders transformers' Auto classes load with the same
logits; fine-tuning starts from the discriminator's encoder; what the shared-embedding model cannot hold is
refused with one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from architectures.hf_parity import (ROOT, VOCAB_FILE, encoder_hidden_diff, finetune_ner_and_export, import_hf_folder,
                                     masked_max_diff, padded_batch, perturb_norms_and_biases, vocab_lines)
from harness import run_world

SEQ, H, G = 32, 64, 32
EPS = 1e-7  # not ELECTRA's 1e-12: shows layer_norm_eps is carried over


def _configs(vocab: int):
    from transformers import ElectraConfig

    common = dict(vocab_size=vocab, embedding_size=H, num_hidden_layers=2, max_position_embeddings=64,
                  type_vocab_size=2, layer_norm_eps=EPS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  initializer_range=0.2)
    # the generator's heads keep the discriminator's width (16) and its FFN is 4 G: what the model derives
    return (ElectraConfig(hidden_size=H, num_attention_heads=4, intermediate_size=128,
                          architectures=["ElectraForPreTraining"], **common),
            ElectraConfig(hidden_size=G, num_attention_heads=2, intermediate_size=4 * G,
                          architectures=["ElectraForMaskedLM"], **common))


def _batch(vocab: int):
    ids, amask, types = padded_batch(vocab, SEQ, (SEQ, 21, 9))
    return ids * amask, amask, types


def _make_and_import(root: str) -> dict:
    """Both HF folders, their logits on the batch, and ``bio-megatron import hf --generator --verify`` of them
    (through the CLI, as a user runs it)."""
    import torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    vocab = vocab_lines()
    dcfg, gcfg = _configs(vocab)
    torch.manual_seed(0)
    models = {"disc": ElectraForPreTraining(dcfg).eval(), "gen": ElectraForMaskedLM(gcfg).eval()}
    for hf in models.values():
        perturb_norms_and_biases(hf)
    # ELECTRA shares one embedding: the generator's copy is the discriminator's (its LM head stays tied)
    with torch.no_grad():
        models["gen"].electra.embeddings.load_state_dict(models["disc"].electra.embeddings.state_dict())
    ids, amask, types = _batch(vocab)
    out = {"vocab": vocab}
    for name, hf in models.items():
        hf.save_pretrained(f"{root}/{name}")
        shutil.copyfile(VOCAB_FILE, f"{root}/{name}/vocab.txt")
        with torch.no_grad():
            out[name] = hf(input_ids=ids, attention_mask=amask, token_type_ids=types).logits.numpy()
    with torch.no_grad():
        out["hidden"] = models["disc"].electra(input_ids=ids, attention_mask=amask,
                                               token_type_ids=types).last_hidden_state.numpy()
    out["import"] = import_hf_folder(f"{root}/disc", f"{root}/ckpt", "--generator", f"{root}/gen")
    assert out["import"]["rc"] == 0, out["import"]
    return out


def _our_logits(ckpt: str, tp: int) -> dict | None:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from bio_megatron.formats.hf.electra import electra_forward, load_electra
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel
    from bio_megatron.formats.source import resolve_source

    init_distributed()
    init_model_parallel(tp, 1, seed=1)
    model, m, tok = load_electra(resolve_source(ckpt), tp)
    batch = _batch(tok.vocab_size)
    with torch.no_grad():
        out = electra_forward(model)(*batch)
        gen = gather_from_tensor_model_parallel_region(out["generator"].contiguous())
    if ps.get_tensor_model_parallel_rank():
        return None
    return {"disc": out["discriminator"].squeeze(-1).numpy(), "gen": gen[..., :tok.vocab_size].numpy(),
            "fraction": m.generator_hidden_fraction,
            "padded_max": gen[batch[1].bool()][:, tok.vocab_size:].max().item()}


def _diff(got, ref, vocab: int) -> float:
    return masked_max_diff(got, ref, _batch(vocab)[1].bool().numpy())


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_electra")
    (ref,) = run_world(1, _make_and_import, str(root))
    return root, ref


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_imported_electra_logits_equal_transformers(imported, tp):
    root, ref = imported
    if tp == 1:  # import hf --verify ran transformers from the folders against the written checkpoint
        report = ref["import"]["verify"]
        assert report["verified"] and set(report["outputs"]) == {"discriminator", "generator"}, report
        assert ref["import"]["generator_hidden_fraction"] == G / H and ref["import"]["fresh"] == []
        print(f"electra import --verify: {report['outputs']}")
    res = [r for r in run_world(tp, _our_logits, str(root / "ckpt"), tp) if r is not None]
    assert len(res) == 1 and res[0]["fraction"] == G / H
    disc, gen = _diff(res[0]["disc"], ref["disc"], ref["vocab"]), _diff(res[0]["gen"], ref["gen"], ref["vocab"])
    assert abs(ref["gen"]).max() > 1.0 and abs(ref["disc"]).max() > 0.1  # non-trivial logits
    assert disc < 1e-4 and gen < 1e-4, (disc, gen)
    assert res[0]["padded_max"] == float("-inf")  # padded vocabulary entries can never be sampled
    print(f"electra import tp{tp}: max |ours - transformers| discriminator {disc:.2e}, generator {gen:.2e}")


def _export_and_reload(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer

    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.ours import read_ours, write_ours

    info = export_hf(ckpt, out)
    state = read_ours(ckpt)  # what export hf wrote the folders from: the objective and generator width carried
    gen_fc1 = [v.shape for k, v in state.tensors.items() if k.startswith("generator.") and "linear_fc1.weight" in k]
    res = {"class": info["class"], "files": {}, "objective": state.model.objective,
           "fraction": state.model.generator_hidden_fraction, "gen_fc1": gen_fc1,
           "vocab_rows": state.tensors["generator.output_layer.bias"].shape[0] == state.vocab_size}
    # write_ours (the writer import hf of ELECTRA saves through) of that state reads back the same model
    write_ours(state, f"{out}_rewritten", "import test")
    back = read_ours(f"{out}_rewritten")
    res["rewritten"] = {"keys": sorted(back.tensors) == sorted(state.tensors),
                        "objective": back.model.objective, "fraction": back.model.generator_hidden_fraction,
                        "not_equal": [k for k, v in state.tensors.items()
                                      if not torch.equal(v, back.tensors.get(k, torch.empty(0)))]}
    for name, auto in (("disc", AutoModelForPreTraining), ("gen", AutoModelForMaskedLM)):
        folder = Path(out) / ("discriminator" if name == "disc" else "generator")
        hf = auto.from_pretrained(str(folder)).eval()
        ids, amask, types = _batch(hf.config.vocab_size)
        with torch.no_grad():
            res[name] = hf(input_ids=ids, attention_mask=amask, token_type_ids=types).logits.numpy()
        res[f"{name}_class"] = type(hf).__name__
        res["files"][name] = sorted(p.name for p in folder.iterdir())
        res[f"{name}_tokens"] = AutoTokenizer.from_pretrained(str(folder))("Naloxone")["input_ids"]
    card = Path(out) / "generator" / "README.md"  # a card the user edited: --overwrite refuses, before any weight
    card.write_text(card.read_text(encoding="utf-8") + "Our notes.\n", encoding="utf-8")
    try:
        export_hf(ckpt, out, overwrite=True)
    except Exception as exc:  # OutputError, one line naming the card
        res["edited"] = f"{type(exc).__name__}: {exc}"
    res["card_kept"] = card.read_text(encoding="utf-8").endswith("Our notes.\n")
    return res


def test_export_loads_in_transformers_with_same_logits(imported):
    root, ref = imported
    (res,) = run_world(1, _export_and_reload, str(root / "ckpt"), str(root / "export"))
    assert res["class"] == {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"}
    assert res.get("edited", "").startswith(f"OutputError: {root / 'export' / 'generator' / 'README.md'}: edited") \
        and res["card_kept"], res
    # read_ours keeps ELECTRA's objective and its generator (2 layers of width G, real vocabulary rows)
    assert res["objective"] == "electra" and res["fraction"] == G / H, res
    # and write_ours is its inverse for ELECTRA too: the generator's layers, objective and width bit for bit
    assert res["rewritten"] == {"keys": True, "objective": "electra", "fraction": G / H, "not_equal": []}, res
    assert [tuple(s) for s in res["gen_fc1"]] == [(4 * G, G)] * 2 and res["vocab_rows"], res
    assert (res["disc_class"], res["gen_class"]) == ("ElectraForPreTraining", "ElectraForMaskedLM")
    for files in res["files"].values():
        assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json"} <= set(files), files
    assert res["disc_tokens"] == res["gen_tokens"] and len(res["disc_tokens"]) > 2
    disc, gen = _diff(res["disc"], ref["disc"], ref["vocab"]), _diff(res["gen"], ref["gen"], ref["vocab"])
    assert disc < 1e-4 and gen < 1e-4, (disc, gen)
    print(f"electra export -> transformers: max |exported - original| discriminator {disc:.2e}, generator {gen:.2e}")


def _pretrain_electra(over: list[str]) -> str:
    import os

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.training.pretrain import run_pretraining

    recipe = ROOT / "nemo_configs" / "pretrain" / "tiny_electra.yaml"
    return run_pretraining(load_pretrain_config(recipe, over, world_size=int(os.environ["WORLD_SIZE"])))


def _export_pretrained(ckpt: str, out: str) -> dict:
    """``export hf`` of an engine-trained checkpoint; transformers' logits vs ours (TP1) on verify's batch."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.hf.electra import electra_forward, load_electra
    from bio_megatron.formats.verify import fixed_batch
    from bio_megatron.formats.source import resolve_source

    export_hf(ckpt, out)
    model, m, tok = load_electra(resolve_source(ckpt))
    ids, mask, types = fixed_batch(tok.vocab_size, m.max_position_embeddings, 32)
    with torch.no_grad():
        ours = electra_forward(model)(ids, mask, types)
        theirs = {k: auto.from_pretrained(f"{out}/{folder}")(input_ids=ids, attention_mask=mask,
                                                              token_type_ids=types).logits
                  for k, auto, folder in (("disc", AutoModelForPreTraining, "discriminator"),
                                          ("gen", AutoModelForMaskedLM, "generator"))}
    valid = mask.bool()
    return {"disc": float((ours["discriminator"].squeeze(-1) - theirs["disc"])[valid].abs().max()),
            "gen": float((ours["generator"][..., :tok.vocab_size] - theirs["gen"])[valid].abs().max()),
            "scale": float(theirs["gen"][valid].abs().max())}


def test_engine_trained_tp2_checkpoint_exports(pubmed_prefix, tmp_path):
    """tiny_electra pretrained 2 steps at TP2, exported (resharded to TP1): both folders give our logits."""
    from engine.pretrain_runs import overrides

    over = overrides(pubmed_prefix, tmp_path, "electra", tp=2, steps=2, save_last=True)
    assert run_world(2, _pretrain_electra, over) == ["finished", "finished"]
    (res,) = run_world(1, _export_pretrained, str(tmp_path / "electra" / "checkpoints"), str(tmp_path / "hf"))
    assert res["scale"] > 0.1 and res["disc"] < 1e-4 and res["gen"] < 1e-4, res
    print(f"engine-trained electra (TP2) -> transformers: max |diff| discriminator {res['disc']:.2e}, "
          f"generator {res['gen']:.2e}")


def _finetune_sources(root: str) -> dict:
    """The discriminator alone imported (BioELECTRA publishes no generator: a fresh one, verified on the
    discriminator), then the fine-tuning encoder (identity head) filled from each ELECTRA source: its hidden
    states equal transformers' discriminator's."""
    import numpy as np
    import torch

    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    alone = import_hf_folder(f"{root}/disc", f"{root}/ckpt_disc_only")
    assert alone["rc"] == 0, alone
    init_distributed()
    init_model_parallel(1, 1, seed=1)
    ids, amask, types = _batch(vocab_lines())
    theirs = torch.from_numpy(np.load(f"{root}/hidden.npy"))
    out = {"alone": alone}
    for name in ("ckpt", "ckpt_disc_only", "disc"):
        out[name] = encoder_hidden_diff(f"{root}/{name}", ids, amask, types, theirs)
    return out


def test_finetune_ner_starts_from_the_discriminator(imported, tmp_path):
    import numpy as np

    root, ref = imported
    np.save(root / "hidden.npy", ref["hidden"])
    (res,) = run_world(1, _finetune_sources, str(root))
    alone = res.pop("alone")
    assert alone["fresh"] == ["generator"] and alone["generator_hidden_fraction"] == pytest.approx(1 / 3)
    assert alone["verify"]["verified"] and set(alone["verify"]["outputs"]) == {"discriminator"}, alone["verify"]
    assert all(v < 1e-4 for v in res.values()), res
    print(f"electra -> fine-tuning encoder: max |ours - transformers' hidden states| {res}")
    # an ELECTRA-initialised fine-tuned model is a post-LN BERT encoder + head: the plain BertFor* class
    exp = finetune_ner_and_export(root / "ckpt", tmp_path)
    print(f"electra -> finetune ner -> BertForTokenClassification: max |diff| {exp['diff']:.2e}; "
          f"discriminator-only --verify {alone['verify']['outputs']}")


def _edited(src: Path, dst: Path, config: dict | None = None, tensor: str | None = None) -> Path:
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    if tensor:
        from safetensors.torch import load_file, save_file

        state = load_file(str(dst / "model.safetensors"))
        state[tensor] = state[tensor] + 1e-3
        save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("which,config,tensor,message", [
    ("disc", {"embedding_size": 32}, None, r"embedding_size \(32\) != hidden_size \(64\)"),
    ("disc", {"hidden_act": "gelu_new"}, None, "hidden_act 'gelu_new'"),
    ("disc", {"position_embedding_type": "relative_key"}, None, "position_embedding_type 'relative_key'"),
    ("disc", {"architectures": ["ElectraForMaskedLM"]}, None, "an ELECTRA generator: pass it with --generator"),
    ("disc", {"architectures": ["ElectraForTokenClassification"]}, None, "ELECTRA imports as ElectraForPreTraining"),
    ("gen", {"hidden_act": "relu"}, None, "hidden_act 'relu'"),
    ("gen", {"embedding_size": 48}, None, r"embedding_size \(48\) != the discriminator's hidden_size \(64\)"),
    ("gen", {"num_attention_heads": 4}, None, r"\(layers, hidden, heads, ffn\) \(2, 32, 4, 128\) != \(2, 32, 2, 128\)"),
    ("gen", None, "electra.embeddings.position_embeddings.weight",
     "generator's embeddings.position_embeddings.weight differs from the discriminator's"),
    ("gen", None, "electra.embeddings.LayerNorm.bias", "generator's embeddings.LayerNorm.bias differs"),
])
def test_refuses_what_the_shared_embedding_model_cannot_hold(imported, tmp_path, which, config, tensor, message):
    """Each refusal comes before any process group exists (so it runs in the pytest process) and writes nothing."""
    from bio_megatron.formats.hf.convert import import_hf
    from bio_megatron.utils.errors import CheckpointError

    root, _ = imported
    folders = {"disc": root / "disc", "gen": root / "gen"}
    folders[which] = _edited(folders[which], tmp_path / which, config, tensor)
    with pytest.raises(CheckpointError, match=message):
        import_hf(folders["disc"], tmp_path / "out", generator=folders["gen"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config,message", [
    ({"num_hidden_layers": 1}, "num_hidden_layers 1 but the weights hold 2 layers (electra.encoder.layer.{0..1}.*)"),
    ({"max_position_embeddings": 128}, "max_position_embeddings 128 but electra.embeddings.position_embeddings.weight "
                                       "has shape [64, 64] (64 positions)"),
])
def test_discriminator_config_disagreeing_with_its_tensors_is_refused(imported, tmp_path, config, message):
    """A discriminator imported alone (as BioELECTRA publishes it): its config.json is checked against the tensors
    beside it (issue 21: with num_hidden_layers 1 the second layer was dropped without a word)."""
    from bio_megatron.formats.hf.convert import import_hf
    from bio_megatron.utils.errors import CheckpointError

    root, _ = imported
    disc = _edited(root / "disc", tmp_path / "disc", config)
    with pytest.raises(CheckpointError) as err:
        import_hf(disc, tmp_path / "out")
    assert f"{disc}/config.json disagrees with the weights beside it: {message}" == str(err.value)
    assert not (tmp_path / "out").exists()
