"""The family registry (``bio_megatron.families``): every registered family implements the protocol, HF
``model_type``s map to exactly one family, old configs without ``model.family`` are classified by the one inference
table, checkpoints record the family (and load and export the same without it), and an unknown family is one line,
exit 2, before anything is written."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
from pathlib import Path

import pytest
import yaml
from harness import run_world

from engine.pretrain_runs import TINY, overrides

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import FAMILIES, family_named, family_of_hf, family_of_model
from bio_megatron.families.base import Family
from bio_megatron.utils.errors import CheckpointError, ConfigError


def _members(proto: type) -> dict[str, object]:
    return {k: v for k, v in vars(proto).items() if not k.startswith("_") and callable(v)}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_implements_the_protocol(name):
    family = FAMILIES[name]
    assert isinstance(family, Family), f"{name} lacks {[m for m in _members(Family) if not hasattr(family, m)]}"
    assert family.name == name and family.hf_model_types and family.tokenizer_kind in (
        "wordpiece", "bpe", "sentencepiece")
    for member, declared in _members(Family).items():
        want = list(inspect.signature(declared).parameters.values())[1:]  # without self
        have = inspect.signature(getattr(family, member)).parameters
        for p in want:  # every parameter the protocol names, of the same kind
            got = have.get(p.name)
            if got is None and p.kind is p.VAR_KEYWORD:
                got = next((q for q in have.values() if q.kind is q.VAR_KEYWORD), None)
            assert got is not None and got.kind == p.kind, f"{name}.{member}: parameter {p.name} ({p.kind})"
        extra = [q for q in have.values() if q.name not in {p.name for p in want}
                 and q.kind not in (q.VAR_KEYWORD, q.VAR_POSITIONAL) and q.default is q.empty]
        assert not extra, f"{name}.{member}: required parameters the protocol does not pass: {extra}"
    assert family.hf_class(None) and all(family.hf_class(t) for t in ("ner", "qa", "re", "classify"))


def test_each_model_type_names_one_family():
    seen: dict[str, str] = {}
    for family in FAMILIES.values():
        for t in family.hf_model_types:
            assert t not in seen, f"model_type {t} claimed by {seen.get(t)} and {family.name}"
            seen[t] = family.name
            assert family_of_hf({"model_type": t}, "x/config.json") is family
    assert family_of_hf({"model_type": "megatron-bert"}, "x").name == "megatron_bert"
    assert family_of_hf({"model_type": "bio-megatron-bert"}, "x").name == "megatron_bert"  # remote-code classes
    assert family_of_hf({"model_type": "bert"}, "x").name == "bert"
    assert family_of_hf({"model_type": "roberta"}, "x").name == "roberta"
    assert family_of_hf({"model_type": "electra"}, "x").name == "electra"
    with pytest.raises(CheckpointError) as err:
        family_of_hf({"model_type": "gpt2"}, "m/config.json")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("m/config.json: model_type 'gpt2'") and all(t in msg for t in seen)


@pytest.mark.parametrize("model,expected", [
    ({}, "megatron_bert"),                                                    # NeMo's megatron_bert_config.yaml
    ({"transformer_block_type": "pre_ln", "objective": "bert"}, "megatron_bert"),
    ({"transformer_block_type": "post_ln"}, "bert"),                         # PubMedBERT, BioBERT
    ({"transformer_block_type": "post_ln", "objective": "mlm"}, "roberta"),  # bio-lm RoBERTa pretraining
    ({"transformer_block_type": "post_ln", "tokenizer": {"vocab_file": "/x/vocab.json"}}, "roberta"),  # fine-tuned
    ({"transformer_block_type": "post_ln", "objective": "electra"}, "electra"),
    ({"objective": "electra", "tokenizer": {"vocab_file": "vocab.txt"}}, "electra"),
    ({"transformer_block_type": "post_ln", "objective": "mlm", "family": "bert"}, "bert"),  # recorded wins
])
def test_inference_table_for_configs_without_a_family(model, expected):
    assert family_of_model(model).name == expected
    m = ModelConfig(**{k: v for k, v in model.items() if k != "tokenizer"})
    if "tokenizer" in model:
        m.tokenizer.vocab_file = model["tokenizer"]["vocab_file"]
    assert family_of_model(m).name == expected  # a typed config reads the same


def test_the_vocabulary_at_hand_decides_a_bpe_model():
    """A fine-tuned RoBERTa config names its vocabulary by the user's path; the checkpoint's own vocab.json is
    what resolve_source passes."""
    model = {"transformer_block_type": "post_ln", "tokenizer": {"vocab_file": "data/bpe_tiny"}}
    assert family_of_model(model).name == "bert"
    assert family_of_model(model, vocab_file=Path("ckpt/vocab.json")).name == "roberta"


def test_unknown_family_is_one_line_naming_the_choices():
    for bad in ("nope", 3):
        with pytest.raises(ConfigError) as err:
            family_of_model({"family": bad})
        (problem,) = err.value.problems  # one problem, one line (ConfigError lists each under its heading)
        assert "\n" not in problem and problem.startswith(f"model.family ({bad!r}) must be one of ")
        assert all(name in problem for name in FAMILIES)
    assert family_named("bert") is FAMILIES["bert"]


def test_a_family_contradicting_the_layer_order_is_refused():
    """model.family=bert on the default pre-LN config would build Megatron BERT's layers under BERT's name."""
    with pytest.raises(ConfigError) as err:
        family_of_model(ModelConfig(family="bert"))
    (problem,) = err.value.problems
    assert problem == ("model.family (bert) has post_ln layers but model.transformer_block_type is pre_ln: "
                       "set model.transformer_block_type=post_ln")
    assert family_of_model(ModelConfig(family="bert", transformer_block_type="post_ln")).name == "bert"


def _cli(argv: list[str]) -> tuple[int, str]:
    from reliability.cli_log import run_cli

    return run_cli(argv)


def _pretrain(prefix: Path, root: Path, name: str, *extra: str) -> tuple[int, str]:
    argv = ["pretrain", "--config", str(TINY), *overrides(prefix, root, name, steps=2, save_last=True,
                                                          extra=extra)]
    return run_world(1, _cli, argv)[0]


def test_unknown_family_exits_2_through_the_cli_before_writing(pubmed_prefix, tmp_path):
    rc, msg = _pretrain(pubmed_prefix, tmp_path / "runs", "bad", "model.family=bertish")
    assert rc == 2, msg
    assert "model.family ('bertish') must be one of megatron_bert, bert, roberta, electra" in msg
    assert not (tmp_path / "runs" / "bad").exists()  # refused before the run directory was made


def _strip_family(ckpt: Path) -> None:
    """An older checkpoint: no family in config.yaml or bio_megatron.json (checksums rewritten to match)."""
    cfg = yaml.safe_load((ckpt / "config.yaml").read_text())
    del cfg["model"]["family"]
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    meta = json.loads((ckpt / "bio_megatron.json").read_text())
    del meta["family"]
    (ckpt / "bio_megatron.json").write_text(json.dumps(meta, indent=2) + "\n")
    manifest = json.loads((ckpt / "checksums.json").read_text())
    for name in ("config.yaml", "bio_megatron.json"):
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "checksums.json").write_text(json.dumps(manifest))


def _export(ckpt: str, out: str) -> tuple[str, dict]:
    from bio_megatron.formats.hf.convert import export_hf
    from bio_megatron.formats.source import resolve_source

    res = export_hf(ckpt, out)
    return resolve_source(ckpt).shape["family"], res


@pytest.fixture(scope="module")
def post_ln_run(pubmed_prefix, tmp_path_factory) -> tuple[Path, Path]:
    """A 2-step post-LN pretraining checkpoint written now, and a copy as older checkpoints are (no family)."""
    from bio_megatron.training.checkpoint_dir import latest_checkpoint

    root = tmp_path_factory.mktemp("family_runs")
    rc, msg = _pretrain(pubmed_prefix, root, "post_ln", "model.transformer_block_type=post_ln")
    assert rc == 0, msg
    ckpt = latest_checkpoint(root / "post_ln" / "checkpoints")
    old = root / "old_ckpt"
    shutil.copytree(ckpt, old)
    _strip_family(old)
    return ckpt, old


def test_checkpoints_record_the_family_and_load_without_it(post_ln_run, tmp_path):
    ckpt, old = post_ln_run
    assert yaml.safe_load((ckpt / "config.yaml").read_text())["model"]["family"] == "bert"
    assert json.loads((ckpt / "bio_megatron.json").read_text())["family"] == "bert"
    new_family, new = run_world(1, _export, str(ckpt), str(tmp_path / "hf_new"))[0]
    old_family, before = run_world(1, _export, str(old), str(tmp_path / "hf_old"))[0]
    assert new_family == old_family == "bert"  # recorded / inferred once from post_ln
    assert new["class"] == before["class"] == "BertForMaskedLM"
    for name in ("model.safetensors", "config.json", "vocab.txt"):
        assert (tmp_path / "hf_new" / name).read_bytes() == (tmp_path / "hf_old" / name).read_bytes(), name
    run_world(1, _import, str(tmp_path / "hf_old"), str(tmp_path / "reimported"))  # a checkpoint import hf writes
    assert yaml.safe_load((tmp_path / "reimported" / "config.yaml").read_text())["model"]["family"] == "bert"
    assert json.loads((tmp_path / "reimported" / "bio_megatron.json").read_text())["family"] == "bert"


def test_a_model_fine_tuned_from_an_older_checkpoint_records_its_family(post_ln_run, tmp_path):
    from finetune.ft_runs import finetune_rank

    _, old = post_ln_run
    over = ["model.hidden_dropout=0.0", "model.attention_dropout=0.0", "trainer.max_steps=2",
            "trainer.val_check_interval=2", "model.dataset.max_eval_examples=8", "model.dataset.test_file=null",
            "model.max_position_embeddings=64", "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path}",
            "exp_manager.name=ner", f"model.restore_from_path={old}"]
    best = Path(run_world(1, finetune_rank, "ner", over)[0]["checkpoint"])
    assert yaml.safe_load((best / "config.yaml").read_text())["model"]["family"] == "bert"
    assert json.loads((best / "bio_megatron.json").read_text())["family"] == "bert"


def _import(folder: str, out: str) -> None:
    from bio_megatron.formats.hf.convert import import_hf

    import_hf(folder, out)
