"""BioM-ALBERT's whole path on the bundled corpus: an ALBERT SentencePiece vocabulary (`vocab train --type
sentencepiece`), `data tokenize` with it, `pretrain --config tiny_albert` taking it through NeMo's keys, and
`export hf` of the checkpoint: transformers loads the folder as AlbertForPreTraining with its AlbertTokenizer
(spiece.model), which tokenizes as our tokenizer does, and its MLM and SOP logits equal ours."""

from __future__ import annotations

import json
from pathlib import Path

from harness import run_world

from engine.pretrain_runs import losses, overrides
from families.test_albert_parallel import albert_rank
from reliability.cli_log import run_cli

TEXT = ["Naloxone reverses the antihypertensive effect of clonidine.", "IL-2 and TNF-α levels in HIV-1 patients."]


def _export_and_compare(ckpt: str, out: str) -> dict:
    import torch
    from transformers import AutoModelForPreTraining, AutoTokenizer

    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.verify import load_pretraining

    info = export_hf(ckpt, out)
    hf = AutoModelForPreTraining.from_pretrained(out).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    model, m, tok = load_pretraining(ckpt)
    enc = hf_tok(TEXT, padding=True, return_tensors="pt")
    types = torch.zeros_like(enc["input_ids"])  # one segment per text
    with torch.no_grad():
        theirs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], token_type_ids=types)
        logits, sop = model(enc["input_ids"], enc["attention_mask"], tokentype_ids=types)
    valid = enc["attention_mask"].bool()
    return {"class": info["class"], "loaded": type(hf).__name__, "tokenizer": type(hf_tok).__name__,
            "hf_ids": [ids[: int(n)] for ids, n in zip(enc["input_ids"].tolist(), valid.sum(1).tolist())],
            "our_ids": [[tok.cls, *tok.tokenize(t), tok.sep] for t in TEXT],
            "files": sorted(p.name for p in Path(out).iterdir()), "family": m.family,
            "mlm": float((logits[..., : tok.vocab_size] - theirs.prediction_logits).abs()[valid].max()),
            "sop": float((sop - theirs.sop_logits).abs().max()), "scale": float(theirs.prediction_logits.abs().max())}


def test_sentencepiece_albert_pretrains_and_exports_to_transformers(pubmed_prefix, tmp_path):
    data = Path(pubmed_prefix).parent
    jsonl = [str(data / "pubmed.jsonl"), str(data / "pmc.jsonl")]
    spiece = tmp_path / "spiece.model"
    rc, msg = run_cli(["vocab", "train", "--type", "sentencepiece", "--size", "2000", "--input", *jsonl,
                       "--output", str(spiece)])
    assert rc == 0, msg
    prefix = tmp_path / "corpus"
    rc, msg = run_cli(["data", "tokenize", "--input", *jsonl, "--vocab", str(spiece), "--output-prefix", str(prefix),
                       "--workers", "1"])
    assert rc == 0, msg
    over = overrides(prefix, tmp_path, "albert_sp", steps=2, save_last=True, extra=(
        "model.tokenizer.library=sentencepiece", f"model.tokenizer.tokenizer_model={spiece}"))
    assert run_world(1, albert_rank, over) == [{"status": "finished"}]
    assert sorted(losses(tmp_path / "albert_sp")) == [1, 2]
    ckpt = tmp_path / "albert_sp" / "checkpoints" / "iter_0000002"
    assert json.loads((ckpt / "bio_megatron.json").read_text()).get("family") == "albert"
    (res,) = run_world(1, _export_and_compare, str(ckpt), str(tmp_path / "hf"))
    assert res["class"] == res["loaded"] == "AlbertForPreTraining" and res["family"] == "albert", res
    assert res["tokenizer"].startswith("AlbertTokenizer") and "spiece.model" in res["files"], res
    assert res["hf_ids"] == res["our_ids"], res
    assert res["scale"] > 0.1 and res["mlm"] < 1e-4 and res["sop"] < 1e-4, res
    # and back: the exported folder (spiece.model, no vocab.txt) imports with --verify, carrying the model
    from architectures.hf_parity import import_hf_folder

    (info,) = run_world(1, import_hf_folder, str(tmp_path / "hf"), str(tmp_path / "reimported"))
    assert info["rc"] == 0 and info["verify"]["verified"], info
    assert (tmp_path / "reimported" / "spiece.model").read_bytes() == spiece.read_bytes()
