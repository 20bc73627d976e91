"""Megatron-LM legacy checkpoints in and out, checked by a reader that is not ours.

- a TP2xPP2 pretraining checkpoint (with NSP head) -> ``export megatron-lm`` (TP1) -> transformers' own
  Megatron-LM converter -> HF ``MegatronBertForPreTraining``: MLM and NSP logits equal ours on a padded batch;
- ours -> megatron-lm (TP2) -> ours: every weight bit-equal;
- files arranged as each ``checkpoint_version`` (0, 1, 2, 3) stores its QKV rows, with the name spellings
  of their eras, at TP2 and TP2xPP2, with and without the binary head: import gives the same logits;
- what does not fit (wrong vocabulary, tanh GELU, a pickle that would run code) is refused in one line, exit 2.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from harness import run_world


CONVERTER = (Path(__file__).resolve().parents[3] / "shared" / "reference" / "hf-convert-megatron-bert"
             / "convert_megatron_bert_checkpoint.py")
HEADS = 4  # the tiny size


def _batch(vocab: int):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (3, 24), generator=g)
    lens = torch.tensor([24, 17, 9])  # padding in two of the rows
    mask = (torch.arange(24)[None] < lens[:, None]).long()
    types = (torch.arange(24)[None] >= (lens[:, None] // 2)).long() * mask
    return ids, mask, types


def _outputs(ckpt) -> tuple[torch.Tensor, torch.Tensor | None, dict, int]:
    """(MLM logits over the real vocabulary at valid positions, NSP logits, full TP1 state, vocab size)."""
    from bio_megatron.formats.verify import load_pretraining

    model, m, tok = load_pretraining(ckpt)
    ids, mask, types = _batch(tok.vocab_size)
    with torch.no_grad():
        out = model(ids, mask, tokentype_ids=types)
    lm, binary = out if isinstance(out, tuple) else (out, None)
    v = tok.vocab_size
    state = {k: (t[:v] if k in ("embedding.word_embeddings.weight", "output_layer.bias") else t).clone()
             for k, t in model.state_dict().items() if torch.is_tensor(t)}
    return lm[..., :v][mask.bool()], binary, state, v


# --- transformers' converter (an independent reader) ----------------------------------------------------
def _via_transformers(ckpt: str, out: str) -> dict:
    from transformers import MegatronBertForPreTraining

    from bio_megatron.formats.megatron_lm.convert import export_megatron_lm

    summary = export_megatron_lm(ckpt, out, tp=1)
    shard = Path(out) / "release" / "mp_rank_00" / "model_optim_rng.pt"
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # the converter predates weights_only
    subprocess.run([sys.executable, str(CONVERTER), str(shard)], check=True, env=env, capture_output=True)
    hf, info = MegatronBertForPreTraining.from_pretrained(str(shard.parent), output_loading_info=True)
    ours, ours_nsp, _, v = _outputs(ckpt)
    ids, mask, types = _batch(v)
    with torch.no_grad():
        out = hf.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types)
    theirs = out.prediction_logits[..., :v][mask.bool()]
    return {"diff": (ours - theirs).abs().max().item(), "scale": ours.abs().max().item(),
            "nsp_diff": (ours_nsp - out.seq_relationship_logits).abs().max().item(),
            "missing": info["missing_keys"], "unexpected": info["unexpected_keys"], **summary}


@pytest.mark.skipif(not CONVERTER.is_file(), reason=f"transformers' reference converter not found at {CONVERTER} "
                    "(../shared is absent)")
def test_transformers_converter_reads_our_export(ours, tmp_path):
    (res,) = run_world(1, _via_transformers, str(ours), str(tmp_path / "mlm"))
    assert res["scale"] > 0.5 and res["binary_head"]
    assert not res["missing"] and not res["unexpected"], res
    assert res["diff"] < 1e-4 and res["nsp_diff"] < 1e-4, res


# --- round trip and every checkpoint_version ------------------------------------------------------------
def _load(path: Path) -> dict:
    from bio_megatron.formats.safe_load import safe_torch_load

    return safe_torch_load(path)


def _to_version(qkv: torch.Tensor, version: int, heads: int) -> torch.Tensor:
    """megatron-core's [np, 3, hn] rows -> the layout checkpoint_version stores (inverse of Megatron-LM's fix)."""
    rest, hn = tuple(qkv.shape[1:]), qkv.shape[0] // (3 * heads)
    t = qkv.reshape(heads, 3, hn, *rest)
    t = {0: t.transpose(0, 1), 1: t.transpose(1, 2)}.get(version, t)
    return t.contiguous().reshape(qkv.shape)


def _rewrite(src: Path, dst: Path, version: int, tp: int, pp: int, binary: bool) -> None:
    """Our TP-``tp`` export re-arranged as a Megatron-LM of ``version``'s era would have saved it."""
    layers_per_stage = 4 // pp
    for t in range(tp):
        sd = _load(src / "release" / f"mp_rank_{t:02d}" / "model_optim_rng.pt")
        lm, model = sd["model"]["language_model"], sd["model"]
        enc = {k: (_to_version(v, version, HEADS // tp) if "query_key_value" in k else v)
               for k, v in lm["encoder"].items()}
        if not binary:
            del model["binary_head"], lm["pooler"]
        args = vars(sd["args"])
        if version < 3:  # before 3.0 Megatron-LM called the TP size model_parallel_size
            args.pop("tensor_model_parallel_size")
            args.pop("pipeline_model_parallel_size")
        else:
            args["pipeline_model_parallel_size"] = pp
        for p in range(pp):
            keep = range(p * layers_per_stage, (p + 1) * layers_per_stage)
            stage = {f"layers.{int(k.split('.')[1]) - keep[0]}.{k.split('.', 2)[2]}": v for k, v in enc.items()
                     if k.startswith("layers.") and int(k.split(".")[1]) in keep}  # local indices per stage
            out: dict = {}
            lm_out: dict = {}
            if p == 0:
                lm_out["embedding"] = lm["embedding"]
            if p == pp - 1:
                stage.update({k: v for k, v in enc.items() if k.startswith("final_layernorm")})
                out.update({k: model[k] for k in ("lm_head", "binary_head") if k in model})
                if "pooler" in lm:
                    lm_out["pooler"] = lm["pooler"]
                if pp > 1:
                    out["word_embeddings_for_head"] = {"weight": lm["embedding"]["word_embeddings"]["weight"]}
            if version == 1:  # the 2020 spellings (BioMegatron's era)
                stage = {k.replace("self_attention.", "attention."): v for k, v in stage.items()}
                lm_out["transformer"] = stage
            elif version == 2:  # today's spellings, flattened dotted keys
                stage = {k.replace("layernorm", "norm"): v for k, v in stage.items()}
                lm_out["encoder"] = stage
                out["lm_head"] = {k.replace("layernorm", "norm"): v for k, v in out.get("lm_head", {}).items()}
                if not out["lm_head"]:
                    del out["lm_head"]
            else:
                lm_out["encoder"] = stage
            out = {"language_model": lm_out, **out}
            if version == 2:
                from bio_megatron.formats.megatron_lm.state import flatten
                out = flatten(out)
            record = {"model": out, "args": argparse.Namespace(**args), "iteration": 5}
            if version > 0:  # files from before checkpoint_version existed are version 0
                record["checkpoint_version"] = float(version)
            name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            (dst / "iter_0000005" / name).mkdir(parents=True, exist_ok=True)
            torch.save(record, dst / "iter_0000005" / name / "model_optim_rng.pt")
    (dst / "latest_checkpointed_iteration.txt").write_text("5")


def _roundtrip_and_versions(ckpt: str, root: str) -> dict:
    from bio_megatron.formats.megatron_lm.convert import export_megatron_lm, import_megatron_lm

    root_p = Path(root)
    ref_lm, ref_bin, ref_state, _ = _outputs(ckpt)
    export_megatron_lm(ckpt, root_p / "tp2", tp=2)
    files = sorted(p.relative_to(root_p / "tp2").as_posix() for p in (root_p / "tp2").rglob("*") if p.is_file())
    import_megatron_lm(root_p / "tp2", root_p / "back")
    _, _, back_state, _ = _outputs(root_p / "back")
    res = {"files": files, "state_keys_equal": sorted(back_state) == sorted(ref_state),
           "not_bit_equal": [k for k in ref_state if not torch.equal(ref_state[k], back_state.get(k, torch.empty(0)))],
           "versions": {}}
    vocab = root_p / "tp2" / "vocab.txt"
    for version, tp, pp, binary in ((0, 2, 1, True), (1, 2, 1, True), (2, 2, 1, False), (3, 2, 2, True)):
        legacy = root_p / f"v{version}"
        _rewrite(root_p / "tp2", legacy, version, tp, pp, binary)
        summary = import_megatron_lm(legacy, root_p / f"v{version}_ours", vocab=vocab)
        lm, binary_logits, _, _ = _outputs(root_p / f"v{version}_ours")
        res["versions"][version] = {
            "lm_diff": (lm - ref_lm).abs().max().item(), "binary_head": summary["binary_head"],
            "binary_diff": (binary_logits - ref_bin).abs().max().item() if binary_logits is not None else None,
            "tp": summary["tp"], "pp": summary["pp"], "checkpoint_version": summary["checkpoint_version"]}
    return res


def test_roundtrip_and_every_checkpoint_version(ours, tmp_path):
    (res,) = run_world(1, _roundtrip_and_versions, str(ours), str(tmp_path))
    assert res["files"] == [".bio_megatron_output.json", "latest_checkpointed_iteration.txt",
                            "release/mp_rank_00/model_optim_rng.pt", "release/mp_rank_01/model_optim_rng.pt",
                            "vocab.txt"]
    assert res["state_keys_equal"] and res["not_bit_equal"] == [], res
    for version, r in res["versions"].items():
        assert r["lm_diff"] == 0.0, (version, r)
        assert r["binary_head"] == (version != 2)
        if r["binary_head"]:
            assert r["binary_diff"] == 0.0, (version, r)
    assert res["versions"][3]["pp"] == 2 and res["versions"][0]["tp"] == 2


# --- refusals ---------------------------------------------------------------------------------------------
def _cli(argv: list[str]) -> tuple[int, str]:
    from bio_megatron.cli import main
    from bio_megatron.utils.log import get_logger

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    get_logger().addHandler(handler)
    return main(argv), buf.getvalue()


class _Payload:
    """Unpickling this would create a file: what a malicious checkpoint could do."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_refuses_what_does_not_fit(ours, tmp_path):
    exported = tmp_path / "tp1"
    (res,) = run_world(1, _cli, ["export", "megatron-lm", "--checkpoint", str(ours), "--out", str(exported)])
    assert res[0] == 0, res
    shard = exported / "release" / "mp_rank_00" / "model_optim_rng.pt"
    bundle = tmp_path / "MegatronBERT.zip"  # as NGC ships: a zip around release/mp_rank_00/model_optim_rng.pt
    # deflated, as zip tools write it: the archive limits (issue 21) admit a real checkpoint's ratio and sizes
    with zipfile.ZipFile(bundle, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(shard, "release/mp_rank_00/model_optim_rng.pt")
    rc, msg = run_world(1, _cli, ["import", "megatron-lm", "--checkpoint", str(bundle), "--vocab",
                                  str(exported / "vocab.txt"), "--out", str(tmp_path / "from_zip")])[0]
    assert rc == 0 and (tmp_path / "from_zip" / "bio_megatron.json").is_file(), msg
    vocab = (exported / "vocab.txt").read_text().splitlines()
    short = tmp_path / "short_vocab.txt"
    short.write_text("\n".join(vocab[:-300]) + "\n")
    rc, msg = run_world(1, _cli, ["import", "megatron-lm", "--checkpoint", str(exported), "--vocab", str(short),
                                  "--out", str(tmp_path / "x")])[0]
    assert rc == 2 and "wrong vocabulary file" in msg and len(msg.strip().splitlines()) == 1, msg

    sd = _load(shard)
    sd["args"].openai_gelu = True
    gelu = tmp_path / "gelu.pt"
    torch.save(sd, gelu)
    rc, msg = run_world(1, _cli, ["import", "megatron-lm", "--checkpoint", str(gelu), "--vocab",
                                  str(exported / "vocab.txt"), "--out", str(tmp_path / "y")])[0]
    assert rc == 2 and "openai_gelu" in msg and len(msg.strip().splitlines()) == 1, msg

    created = tmp_path / "PWNED"
    evil = tmp_path / "evil" / "release" / "mp_rank_00"
    evil.mkdir(parents=True)
    torch.save({"model": sd["model"], "args": sd["args"], "hook": _Payload(str(created))},
               evil / "model_optim_rng.pt")
    (tmp_path / "evil" / "latest_checkpointed_iteration.txt").write_text("release")
    rc, msg = run_world(1, _cli, ["import", "megatron-lm", "--checkpoint", str(tmp_path / "evil"), "--vocab",
                                  str(exported / "vocab.txt"), "--out", str(tmp_path / "z")])[0]
    assert rc == 2 and "refusing" in msg and "open" in msg and len(msg.strip().splitlines()) == 1, msg
    assert not created.exists() and not (tmp_path / "z").exists()
