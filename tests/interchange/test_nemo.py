"""NeMo ``.nemo`` archives in and out.

- a TP2xPP2 pretraining checkpoint (NSP head) -> ``export nemo`` in each weight layout NeMo writes (single
  ``model_weights.ckpt``, ``mp_rank_TT/``, ``tp_rank_TT_pp_rank_PPP/``, dist ``model_weights/``) -> ``import
  nemo``: every weight bit-equal, logits equal;
- the exported state-dict names and shapes equal the ones NeMo 2.4's legacy ``MegatronBertModel`` has for the
  tiny shape, listed here from NeMo's source (not from our mapping);
- ``model_config.yaml`` loads with OmegaConf and carries NeMo's key names;
- a TP2xPP2 fine-tuned NER checkpoint -> ``.nemo`` (TP2 x PP2) -> ours: same labels, same logits, same entities;
- archives that would write outside their folder or unpickle code are refused in one line.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import torch
from finetune.ft_runs import finetune_rank
from harness import cli_forked, run_world

from interchange.test_megatron_lm import _outputs

TEXT = "Naloxone reverses the antihypertensive effect of clonidine in rats."


def _members(path: Path) -> list[str]:
    with tarfile.open(path) as tf:
        return sorted(m.name for m in tf.getmembers() if m.isfile())


def _layouts(ckpt: str, root: str) -> dict:
    from bio_megatron.formats.nemo.convert import export_nemo, import_nemo

    root_p = Path(root)
    ref_lm, ref_bin, ref_state, _ = _outputs(ckpt)
    res = {}
    for name, kw in {"single": {}, "mp_rank": {"tp": 2}, "tp_pp_rank": {"tp": 2, "pp": 2},
                     "dist": {"mcore": True}}.items():
        archive = root_p / f"{name}.nemo"
        summary = export_nemo(ckpt, archive, **kw)
        back = import_nemo(archive, root_p / f"{name}_ours")
        lm, binary, state, _ = _outputs(root_p / f"{name}_ours")
        res[name] = {"members": _members(archive), "summary": summary, "back": back,
                     "keys_equal": sorted(state) == sorted(ref_state),
                     "not_bit_equal": [k for k in ref_state
                                       if not torch.equal(ref_state[k], state.get(k, torch.empty(0)))],
                     "lm_diff": (lm - ref_lm).abs().max().item(), "binary_diff": (binary - ref_bin).abs().max().item()}
    return res


def test_every_weight_layout_roundtrips_bit_exact(ours, tmp_path):
    (res,) = run_world(1, _layouts, str(ours), str(tmp_path))
    files = {k: sorted(m.split("_", 1)[1] if m.startswith("./") and m[2:34].isalnum() and len(m) > 35 and m[34] == "_"
                 else m for m in r["members"]) for k, r in res.items()}
    assert files["single"] == ["./model_config.yaml", "./model_weights.ckpt", "vocab.txt"], files
    assert files["mp_rank"] == ["./model_config.yaml", "./mp_rank_00/model_weights.ckpt",
                                "./mp_rank_01/model_weights.ckpt", "vocab.txt"], files
    assert files["tp_pp_rank"] == ["./model_config.yaml"] + [
        f"./tp_rank_{t:02d}_pp_rank_{p:03d}/model_weights.ckpt" for t in range(2) for p in range(2)] + ["vocab.txt"]
    assert any(m.startswith("./model_weights/") for m in files["dist"])
    for name, r in res.items():
        assert r["keys_equal"] and r["not_bit_equal"] == [], (name, r["not_bit_equal"])
        assert r["lm_diff"] == 0.0 and r["binary_diff"] == 0.0, (name, r)
        assert r["back"]["binary_head"] and r["back"]["num_layers"] == 4


# NeMo 2.4's legacy MegatronBertModel for the tiny shape (hidden 64, 4 heads, ffn 256, 4 layers), binary head on,
# TP1 x PP1, read from nemo_toolkit-2.4.0's source (not from our mapping):
# - megatron_bert_model.py:115-120,182-214  self.model = NeMoBertModel(..., num_tokentypes=2 if bert_binary_head,
#   add_pooler=cfg.get('add_pooler', True)): the prefix "model."
# - megatron/bert/bert_model.py:529-562  language_model (get_language_model), lm_head = BertLMHead, binary_head
#   = get_linear_layer(hidden, 2); BertLMHead (:114-123): bias [vocab], dense [h, h], layernorm
# - modules/common/megatron/language_model.py:280-312 Embedding: word_embeddings (VocabParallelEmbedding),
#   position_embeddings, tokentype_embeddings; :704 pooler = Pooler (dense)
# - transformer.py:227-281,430 ParallelTransformerLayer_: input_layernorm, self_attention, post_attention_layernorm,
#   mlp; :1255 layers; :1281 final_layernorm. attention.py:193,240 query_key_value (Column), dense (Row);
#   mlp.py:122,192 dense_h_to_4h (Column), dense_4h_to_h (Row). megatron-core's Column/RowParallelLinear add
#   "_extra_state" (tensor_parallel/layers.py get_extra_state).
def _nemo_tiny_names(vocab_rows: int, positions: int) -> dict[str, tuple | None]:
    h, f = 64, 256
    names: dict[str, tuple | None] = {
        "model.language_model.embedding.word_embeddings.weight": (vocab_rows, h),
        "model.language_model.embedding.position_embeddings.weight": (positions, h),
        "model.language_model.embedding.tokentype_embeddings.weight": (2, h)}
    for i in range(4):
        p = f"model.language_model.encoder.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (h,), p + "input_layernorm.bias": (h,),
            p + "self_attention.query_key_value.weight": (3 * h, h),
            p + "self_attention.query_key_value.bias": (3 * h,),
            p + "self_attention.query_key_value._extra_state": None,
            p + "self_attention.dense.weight": (h, h), p + "self_attention.dense.bias": (h,),
            p + "self_attention.dense._extra_state": None,
            p + "post_attention_layernorm.weight": (h,), p + "post_attention_layernorm.bias": (h,),
            p + "mlp.dense_h_to_4h.weight": (f, h), p + "mlp.dense_h_to_4h.bias": (f,),
            p + "mlp.dense_h_to_4h._extra_state": None,
            p + "mlp.dense_4h_to_h.weight": (h, f), p + "mlp.dense_4h_to_h.bias": (h,),
            p + "mlp.dense_4h_to_h._extra_state": None})
    names.update({
        "model.language_model.encoder.final_layernorm.weight": (h,),
        "model.language_model.encoder.final_layernorm.bias": (h,),
        "model.language_model.pooler.dense.weight": (h, h), "model.language_model.pooler.dense.bias": (h,),
        "model.lm_head.bias": (vocab_rows,), "model.lm_head.dense.weight": (h, h), "model.lm_head.dense.bias": (h,),
        "model.lm_head.layernorm.weight": (h,), "model.lm_head.layernorm.bias": (h,),
        "model.binary_head.weight": (2, h), "model.binary_head.bias": (2,)})
    return names


def test_names_and_config_are_nemos(ours, tmp_path):
    from omegaconf import OmegaConf

    from bio_megatron.formats.safe_load import safe_torch_load

    archive = tmp_path / "m.nemo"
    r = cli_forked(["export", "nemo", "--checkpoint", str(ours), "--out", str(archive)])
    assert r.returncode == 0, r.stderr[-2000:]
    with tarfile.open(archive) as tf:
        sd = safe_torch_load(io.BytesIO(tf.extractfile("./model_weights.ckpt").read()), "w")
        cfg = OmegaConf.create(tf.extractfile("./model_config.yaml").read().decode())
        members = tf.getnames()
    got = {k: (tuple(v.shape) if torch.is_tensor(v) else v) for k, v in sd.items()}
    want = _nemo_tiny_names(got["model.lm_head.bias"][0], cfg.max_position_embeddings)
    assert got == want
    assert got["model.lm_head.bias"][0] % 128 == 0
    assert cfg.target == "nemo.collections.nlp.models.language_modeling.megatron_bert_model.MegatronBertModel"
    assert (cfg.num_layers, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads) == (4, 64, 256, 4)
    assert cfg.bert_binary_head and cfg.precision == 32 and cfg.tokenizer.vocab_file.startswith("nemo:")
    assert "./" + cfg.tokenizer.vocab_file[len("nemo:"):] in members


def _ner_roundtrip(ckpt: str, root: str) -> dict:
    from bio_megatron.formats.nemo.convert import export_nemo, import_nemo
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.predict.ner import predict_entities

    root_p = Path(root)
    summary = export_nemo(ckpt, root_p / "ner.nemo", tp=2, pp=2)
    back = import_nemo(root_p / "ner.nemo", root_p / "ner_ours")
    a, b = load_finetuned(ckpt), load_finetuned(root_p / "ner_ours")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, a.tokenizer.vocab_size, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        la, lb = a.model(ids, mask, torch.zeros_like(ids)), b.model(ids, mask, torch.zeros_like(ids))
    with tarfile.open(root_p / "ner.nemo") as tf:
        sd = torch.load(io.BytesIO(tf.extractfile("./tp_rank_00_pp_rank_001/model_weights.ckpt").read()),
                        weights_only=True)
    return {"summary": summary, "back": back, "labels": (a.labels, b.labels), "diff": (la - lb).abs().max().item(),
            "scale": la.abs().max().item(), "entities": (predict_entities(a, TEXT), predict_entities(b, TEXT)),
            "head_keys": sorted(k for k in sd if k.startswith("classifier.")),
            "encoder_prefix": sorted({k.split("language_model")[0] for k in sd if "language_model" in k})}


def test_finetuned_ner_roundtrips_with_labels(tmp_path):
    run_world(4, finetune_rank, "ner", ["trainer.max_steps=4", "model.head.num_fc_layers=2",
                                        "model.dataset.max_eval_examples=8", "model.dataset.test_file=null",
                                        "trainer.val_check_interval=4",
                                        f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=tp2pp2",
                                        "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=2"])
    (res,) = run_world(1, _ner_roundtrip, str(tmp_path / "tp2pp2" / "checkpoints"), str(tmp_path))
    assert res["labels"][0] == res["labels"][1] == ["O", "B-Chemical", "I-Chemical"]
    assert res["scale"] > 0.1 and res["diff"] == 0.0, res
    assert res["entities"][0] == res["entities"][1]
    assert res["head_keys"] == ["classifier.mlp.layer0.bias", "classifier.mlp.layer0.weight",
                                "classifier.mlp.layer2.bias", "classifier.mlp.layer2.weight"]
    assert res["encoder_prefix"] == ["bert_model.model."]
    assert res["back"]["task"] == "ner" and res["summary"]["target"].endswith("TokenClassificationModel")


def test_unsafe_archives_are_refused(tmp_path):
    def archive(name: str, payload: bytes) -> Path:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.nemo"
        with tarfile.open(path, "w:") as tf:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
        return path

    for path, expect in ((archive("../evil.txt", b"x"), "'..'"), (archive("/abs.txt", b"x"), "absolute")):
        r = cli_forked(["import", "nemo", "--model", str(path), "--out", str(tmp_path / "o")])
        assert r.returncode == 2 and expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path.parent / "evil.txt").exists()
    buf = io.BytesIO()
    torch.save({"model.x": torch.zeros(1), "evil": subprocess.Popen}, buf)
    bad = tmp_path / "bad_dir"
    bad.mkdir()
    (bad / "model_config.yaml").write_text("num_attention_heads: 4\n")
    (bad / "model_weights.ckpt").write_bytes(buf.getvalue())
    path = tmp_path / "pickle.nemo"
    with tarfile.open(path, "w:") as tf:
        tf.add(str(bad), arcname=".")
    r = cli_forked(["import", "nemo", "--model", str(path), "--out", str(tmp_path / "o2")])
    assert r.returncode == 2 and "refusing to load" in r.stderr, r.stderr
