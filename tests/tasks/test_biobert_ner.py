"""BC4CHEMD, LINNAEUS and Species-800 as BioBERT ships them (issue 23 item 1; datasets/NER/<name>/train.tsv,
devel.tsv, test.tsv: ``token<TAB>tag`` lines with untyped B/I/O tags, a blank line after each sentence), on the
synthetic files of tests/fixtures/clinical/biobert_ner (multi-token and hyphenated mentions, mentions that open a
sentence, a sentence without any, non-ASCII): read with hand-counted spans, and each of the three bio-lm recipes
runs on them unchanged but for ``model.dataset.data_dir``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reliability.cli_log import run_cli
from bio_megatron.tasks.ner_data import read_iob

ROOT = Path(__file__).resolve().parents[2]
BIOBERT = ROOT / "tests" / "fixtures" / "clinical" / "biobert_ner"


def _mentions(sentences) -> list[list[str]]:
    """Each mention's words, read from the tags (B opens one, I continues it)."""
    out = []
    for s in sentences:
        for word, tag in zip(s.words, s.tags):
            if tag == "B":
                out.append([word])
            elif tag == "I":
                out[-1].append(word)
    return out


def test_biobert_ner_files_are_read_untyped_by_hand():
    train, dev, test = (read_iob(BIOBERT / f) for f in ("train.tsv", "devel.tsv", "test.tsv"))
    assert [len(s.words) for s in train] == [11, 6, 4] and len(dev) == 1 and len(test) == 2
    assert _mentions(train) == [["Cisplatin"], ["β", "-", "carotene"], ["Escherichia", "coli", "K-12"]]
    assert _mentions(dev) == [["Mice"], ["Mus", "musculus"], ["5", "-", "fluorouracil"]]
    assert _mentions(test) == [["Saccharomyces", "cerevisiae"], ["rats"], ["glucose"]]
    assert test[1].words[0] == "Naïve" and set(train[2].tags) == {"O"}


@pytest.mark.parametrize("recipe", ["bc4chemd", "linnaeus", "species_800"])
def test_biolm_recipe_runs_unchanged_on_biobert_files(capsys, recipe):
    rc, msg = run_cli(["finetune", "ner", "--config", str(ROOT / "nemo_configs" / "ner" / f"{recipe}.yaml"),
                       "--dry-run", f"model.dataset.data_dir={BIOBERT}"], logging.ERROR, " | ")
    assert rc == 0, msg
    out = json.loads(capsys.readouterr().out)
    assert out["labels"] == ["O", "B", "I"]  # BioBERT's untyped tags, the pad label first
    assert (out["data"]["train_examples"], out["data"]["dev_examples"]) == (3, 1)
    assert out["data"]["test_file"] == str(BIOBERT / "test.tsv")
    cfg = out["config"]  # bio-lm's sequence-labelling protocol (paper 004 §5.2)
    assert (cfg["model"]["optim"]["lr"], cfg["model"]["global_batch_size"], cfg["trainer"]["max_epochs"],
            cfg["trainer"]["val_check_interval"]) == (1e-5, 32, 20, 500)
