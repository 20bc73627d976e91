"""The BioMegatron pretraining recipes follow the paper where it speaks and say `# assumed` where it does not.

- every size x vocabulary recipe exists, loads and validates at a real layout;
- the 1.2b recipe (paper: continued from a general-domain checkpoint, BERT-uncased vocabulary) refuses to
  start without ``model.restore_from_path``: a ConfigError, and exit 2 from the CLI, quoting the reason;
- every number written in the BioMegatron recipe files is either paper-stated (``PAPER_KEYS``, marked
  ``# paper``) or marked ``# assumed``, and the values that define the training are set in those files
  rather than inherited silently from the generic ``_base.yaml``;
- ``trainer.max_steps`` is "about one epoch" of the paper's 6.1B words: checked against the sub-tokens per
  word that the recipe's own vocabulary gives on the real PubMed sample in ``../shared``.
"""

from __future__ import annotations

import gzip
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from bio_megatron.cli import main
from bio_megatron.config.pretrain import load_pretrain_config
from bio_megatron.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "nemo_configs" / "pretrain"
PUBMED = ROOT.parent / "shared" / "data" / "corpus" / "pubmed"
RECIPES = sorted(PRETRAIN.glob("biomegatron_*.yaml"))
VOCABS = {"": "bert_base_cased", "_uncased": "bert_base_uncased", "_bio_30k": "30k", "_bio_50k": "50k"}
PAPER_WORDS = 6.1e9  # PubMed abstracts 4.5B + PMC CC0 full text 1.6B words (paper)
# Numbers the paper states (or that are computed from numbers it states), each marked `# paper` in the YAML.
PAPER_KEYS = {"data_prefix"}  # corpus weights 4.5/6.1 and 1.6/6.1
# Values that define the training: each must be written in the BioMegatron files, not inherited from _base.
DEFINING = {"trainer.max_steps", "model.size", "model.encoder_seq_length", "model.global_batch_size",
            "model.tokenizer.vocab_file", "model.data.data_prefix", "model.data.masked_lm_prob",
            "model.optim.lr", "model.optim.weight_decay", "model.optim.sched.name",
            "model.optim.sched.warmup_ratio", "model.optim.sched.min_lr", "model.hidden_dropout",
            "model.bert_binary_head"}


def _chain(path: Path) -> list[Path]:
    """The recipe and the files its `defaults` name, recursively, without the generic _base.yaml."""
    out = [path]
    for base in yaml.safe_load(path.read_text()).get("defaults") or []:
        if base != "_base":
            out += _chain(path.parent / f"{base}.yaml")
    return out


def _keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in tree.items():
        keys |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return keys


def test_every_size_and_vocabulary_has_a_recipe():
    names = {p.stem for p in RECIPES}
    assert {f"biomegatron_{s}{v}" for s in ("345m", "800m") for v in VOCABS} | {"biomegatron_1.2b"} <= names
    for s in ("345m", "800m"):
        for suffix, vocab in VOCABS.items():
            cfg = load_pretrain_config(PRETRAIN / f"biomegatron_{s}{suffix}.yaml")
            assert cfg.model.size == s and vocab in cfg.model.tokenizer.vocab_file
            assert cfg.exp_manager.name == f"biomegatron_{s}{suffix}"  # runs of different recipes do not collide


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_validates_at_its_layout(recipe):
    over = ["model.restore_from_path=ckpt/general"] if recipe.stem == "biomegatron_1.2b" else []
    cfg = load_pretrain_config(recipe, over)
    load_pretrain_config(recipe, over, world_size=cfg.model.tensor_model_parallel_size * 2)


def test_1_2b_needs_a_general_domain_checkpoint(capsys, caplog):
    recipe = PRETRAIN / "biomegatron_1.2b.yaml"
    with pytest.raises(ConfigError, match=r"model\.restore_from_path is required by this recipe: the paper's 1\.2b "
                                          r"model continues from a general-domain Megatron checkpoint"):
        load_pretrain_config(recipe)
    cfg = load_pretrain_config(recipe, ["model.restore_from_path=ckpt/general"])
    assert cfg.model.tokenizer.vocab_file == "bert_base_uncased"  # paper: the general-domain model's vocabulary
    caplog.clear()
    rc = main(["pretrain", "--config", str(recipe), "--dry-run"])
    assert rc == 2 and capsys.readouterr().out == ""
    assert "general-domain Megatron checkpoint" in caplog.text  # the CLI prints the reason, no traceback


_NUMBER = re.compile(r"^[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _numeric(value: str) -> bool:
    items = value.strip("[]").split(",") if value.startswith("[") else [value]
    return any(_NUMBER.match(item.strip()) for item in items)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_number_is_paper_or_marked_assumed(recipe):
    files = _chain(recipe)
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code, _, comment = line.partition("#")
            m = re.match(r"^\s*([\w.]+):\s*(\S.*?)\s*$", code)
            if not m or not _numeric(m.group(2)):
                continue
            where = f"{path.name}:{lineno}: {line.strip()}"
            if m.group(1) in PAPER_KEYS:
                assert "paper" in comment, where
            else:
                assert "assumed" in comment, where
    written = set().union(*(_keys(yaml.safe_load(p.read_text())) for p in files))
    assert DEFINING <= written, f"inherited from _base.yaml, not stated by the recipe: {DEFINING - written}"


def _pubmed_texts() -> list[str]:
    texts = []
    for f in sorted(PUBMED.glob("*.xml.gz")):
        root = ET.parse(gzip.open(f)).getroot()
        for tag in ("ArticleTitle", "AbstractText"):
            texts += ["".join(el.itertext()).strip() for el in root.iter(tag)]
    return [t for t in texts if t]


@pytest.mark.skipif(not PUBMED.is_dir(), reason=f"the PubMed sample is not at {PUBMED}")
def test_steps_are_about_one_epoch_of_the_papers_corpus():
    from bio_megatron.data.pretrain import resolve_vocab
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    texts = _pubmed_texts()
    words = sum(len(t.split()) for t in texts)
    assert words > 10_000
    epochs, rates = {}, {}
    for recipe in RECIPES:
        over = ["model.restore_from_path=ckpt/general"] if recipe.stem == "biomegatron_1.2b" else []
        cfg = load_pretrain_config(recipe, over)
        tokens = cfg.trainer.max_steps * cfg.model.global_batch_size * cfg.model.encoder_seq_length
        vocab = cfg.model.tokenizer.vocab_file
        if vocab.startswith("bert_base"):  # measured with the recipe's own vocabulary on real PubMed text
            if vocab not in rates:
                tok = WordPieceTokenizer(resolve_vocab(vocab))
                rates[vocab] = sum(len(e.ids) for e in tok.backend.encode_batch(texts, add_special_tokens=False)) / words
            rate = rates[vocab]
            epochs[recipe.stem] = tokens / (PAPER_WORDS * rate)
            assert 0.98 < epochs[recipe.stem] < 1.02, (recipe.stem, rate, epochs[recipe.stem])
        else:  # a PubMed vocabulary (placeholder): fewer pieces per word than BERT's, more than one
            lo, hi = tokens / (PAPER_WORDS * 1.0), tokens / (PAPER_WORDS * 1.5)
            assert hi < 1.0 < lo, (recipe.stem, hi, lo)
    assert epochs  # (the BERT-vocabulary recipes were measured)
