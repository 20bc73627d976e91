"""An exported NER model as a transformers user meets it: ``pipeline("token-classification")`` loaded from the
folder alone (``HF_HUB_OFFLINE=1``) groups the entities ``bio-megatron predict ner`` finds on the same weights,
with the same scores; the folder has a model card (the Hub's YAML header, scores of the run's ``results.json``,
a snippet that runs) and modes that follow the umask (0644/0755 under 022, 0600/0700 under 077).

One tiny fine-tuning that learns its 12 training sentences by heart (200 steps, no dropout; 25 s; a 2-step
pretraining for its card): on those sentences its sub-tokens carry the labels it was trained on, so both aggregation
strategies the pipeline offers can be compared with ``predict ner``. For ``first`` its head is also replaced by a
seeded random one (in a copy of the export), so that the tags mix O, B- and I- over sub-tokens as a badly trained
model's do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ft_runs import finetune_rank
from harness import cli_forked, run_world

ROOT = Path(__file__).resolve().parents[2]
BC5CDR = ROOT / "tests" / "fixtures" / "ner" / "bc5cdr_chem_devel_head.tsv"
TRAIN_FILE = ROOT / "tests" / "fixtures" / "finetune" / "bc5cdr_chem_train_head.tsv"  # tiny_ner's training file
N_TRAIN = 12
TRAIN = ["trainer.max_steps=300", "trainer.val_check_interval=300", f"model.dataset.max_train_examples={N_TRAIN}",
         "model.dataset.max_eval_examples=16", "model.dataset.test_file=null", "model.global_batch_size=8",
         "model.optim.lr=5e-3", "model.optim.sched.warmup_ratio=0", "model.head.fc_dropout=0",
         "model.hidden_dropout=0", "model.attention_dropout=0"]
OFFLINE_VARS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
OFFLINE = {**os.environ, **OFFLINE_VARS, "OMP_NUM_THREADS": "1"}


def _export(ckpt: Path, out: Path, umask: int) -> None:
    done = cli_forked(["export", "hf", "--checkpoint", str(ckpt), "--out", str(out)], env=OFFLINE_VARS, umask=umask)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def ner_export(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ner_export")
    run_world(1, finetune_rank, "ner", TRAIN + [f"exp_manager.exp_dir={tmp}", "exp_manager.name=run"])
    ckpt = tmp / "run" / "checkpoints"
    for mask in (0o022, 0o077):
        _export(ckpt, tmp / f"hf{mask:03o}", mask)
    return {"run": tmp / "run", "ckpt": ckpt, "hf": tmp / "hf022", "private": tmp / "hf077", "tmp": tmp}


def _modes(folder: Path) -> tuple[set[int], set[int]]:
    files, dirs = set(), {folder.stat().st_mode & 0o777}
    for p in folder.rglob("*"):
        (dirs if p.is_dir() else files).add(p.stat().st_mode & 0o777)
    return files, dirs


def test_exported_files_follow_the_umask(ner_export):
    assert (ner_export["hf"] / "model.safetensors").is_file()
    assert _modes(ner_export["hf"]) == ({0o644}, {0o755})  # the weights were 0600 (transformers' temp file)
    assert _modes(ner_export["private"]) == ({0o600}, {0o700})  # a stricter umask is honoured, not widened


def _front_matter(card: str) -> tuple[dict, str]:
    assert card.startswith("---\n"), card[:200]
    head, body = card[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_export_has_a_model_card_with_hub_metadata(ner_export, tmp_path):
    card = (ner_export["hf"] / "README.md").read_text(encoding="utf-8")
    meta, body = _front_matter(card)
    assert meta["library_name"] == "transformers" and meta["language"] == "en"
    assert meta["pipeline_tag"] == "token-classification"
    assert {"biomedical", "ner"} <= set(meta["tags"])
    assert meta["datasets"] == ["bc5cdr_chem_train_head"]
    dev = json.loads((ner_export["run"] / "results.json").read_text())["dev"]
    (index,) = meta["model-index"]
    (result,) = index["results"]
    assert result["dataset"]["split"] == "validation"
    got = {m["type"]: m["value"] for m in result["metrics"]}
    assert set(got) == {"precision", "recall", "f1", "accuracy"} == set(meta["metrics"])
    assert all(abs(got[k] - dev[k]) < 1e-3 for k in got)
    assert "`O`, `B-Chemical`, `I-Chemical`" in body and "## How to use" in body
    # the card's snippet, pointed at the folder, runs offline and finds what the pipeline finds
    snippet = body.split("```python\n", 1)[1].split("```", 1)[0].replace("PATH_OR_HUB_ID", str(ner_export["hf"]))
    script = tmp_path / "snippet.py"
    script.write_text(snippet.rstrip().rsplit("\n", 1)[0] + "\nprint(type(ner).__name__)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=OFFLINE)
    assert done.returncode == 0 and "TokenClassificationPipeline" in done.stdout, done.stderr[-2000:]


def _sentences(limit: int) -> list[str]:
    """Real BC5CDR sentences, words joined by spaces, each one sentence for predict ner's splitter too."""
    from bio_megatron.tasks.re_data import split_sentences

    out, words = [], []
    for line in BC5CDR.read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip():
            words.append(line.split("\t")[0])
        elif words:
            text = " ".join(words)
            if len(split_sentences(text)) == 1 and len(words) < 60:
                out.append(text)
            words = []
    return out[:limit]


def _random_head(src: Path, dst: Path) -> None:
    """A copy of ``src`` whose classifier is seeded noise centred on these sentences: O, B- and I- mixed."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, MegatronBertModel

    shutil.copytree(src, dst)
    sd = load_file(dst / "model.safetensors")
    tok, enc_model = AutoTokenizer.from_pretrained(dst), MegatronBertModel.from_pretrained(dst).eval()
    enc = tok(_sentences(40), padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = enc_model(**enc).last_hidden_state[enc["attention_mask"].bool()]
    weight = torch.randn(sd["classifier.weight"].shape, generator=torch.Generator().manual_seed(0)) * 0.3
    sd["classifier.weight"], sd["classifier.bias"] = weight, -(hidden.mean(0) @ weight.T)
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})


def _pipeline_entities(folder: str, strategies: tuple[str, ...], texts: list[str]) -> dict[str, list]:
    """transformers' own ``pipeline("token-classification")`` on the folder alone, offline, per strategy: the
    entities of each text (run in a forked process: :func:`run_world`)."""
    import huggingface_hub.constants
    from transformers import pipeline

    huggingface_hub.constants.HF_HUB_OFFLINE = True  # the folder alone: nothing may come from the Hub
    out = {}
    for strategy in strategies:
        pipe = pipeline("token-classification", model=folder, aggregation_strategy=strategy, device="cpu")
        if strategy == "none":  # the pipeline's default: a tag per sub-token (O left out), grouped here as BIO reads
            out[strategy] = [_bio_groups(pipe(t)) for t in texts]
            continue
        out[strategy] = [[{"type": e["entity_group"], "start": int(e["start"]), "end": int(e["end"]),
                           "score": float(e["score"])} for e in pipe(t)] for t in texts]
    return out


def _bio_groups(tokens: list[dict]) -> list[dict]:
    """Entities from the default strategy's sub-tokens: ``B-X`` (or an ``I-X`` after anything but X) opens one,
    ``I-X`` right after a sub-token of X extends it (conlleval's rule)."""
    groups: list[dict] = []
    last = None
    for tok in tokens:
        prefix, _, kind = tok["entity"].partition("-")
        if prefix == "I" and groups and groups[-1]["type"] == kind and tok["index"] == last + 1:
            groups[-1]["end"] = int(tok["end"])
        else:
            groups.append({"type": kind, "start": int(tok["start"]), "end": int(tok["end"])})
        last = tok["index"]
    return groups


def _predict_ner(checkpoint: Path, texts: list[str], tmp: Path) -> list[list[dict]]:
    """``bio-megatron predict ner`` on ``texts`` (one document per line): each document's entities."""
    (tmp / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    done = cli_forked(["predict", "ner", "--checkpoint", str(checkpoint), "--input", str(tmp / "docs.txt"), "--out",
                       str(tmp / "pred.jsonl")], env=OFFLINE_VARS)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line)["entities"] for line in (tmp / "pred.jsonl").read_text().splitlines()]


def test_pipeline_groups_the_entities_predict_ner_finds(ner_export, tmp_path):
    """``aggregation_strategy="first"`` reads each word's tag at its first sub-token as fine-tuning and
    ``predict ner`` do: the same spans, types and scores (predict's entity score is the mean, over the entity's
    words, of that tag's probability; the pipeline's group score is the same mean)."""
    hf = tmp_path / "hf_random"
    _random_head(ner_export["hf"], hf)
    texts = _sentences(40)
    assert len(texts) >= 20
    ours = _predict_ner(hf, texts, tmp_path)
    (theirs,) = run_world(1, _pipeline_entities, str(hf), ("first",), texts)
    theirs = theirs["first"]
    n_entities = sum(map(len, ours))
    multi_word = sum(1 for doc in ours for e in doc if " " in e["text"])
    assert n_entities >= 50 and multi_word >= 5, (n_entities, multi_word)  # the head tags a real mixture
    for text, mine, pipe in zip(texts, ours, theirs):
        assert [(e["type"], e["start"], e["end"]) for e in mine] == [(e["type"], e["start"], e["end"]) for e in pipe], \
            text
        for e, p in zip(mine, pipe):
            assert 0.0 < e["score"] <= 1.0 and abs(e["score"] - p["score"]) < 1e-4, (text, e, p)
            assert e["text"] == text[e["start"]:e["end"]]




def _gold_spans(words: list[str], tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, start, end) of the IOB entities of ``" ".join(words)``."""
    spans, at = [], 0
    for word, tag in zip(words, tags):
        if tag.startswith("B-") or (tag.startswith("I-") and not (spans and spans[-1][3] and spans[-1][0] == tag[2:])):
            spans.append([tag[2:], at, at + len(word), True])
        elif tag.startswith("I-"):
            spans[-1][2] = at + len(word)
        elif spans:
            spans[-1][3] = False
        at += len(word) + 1
    return [(t, a, b) for t, a, b, _ in spans]


def test_simple_and_first_aggregation_group_the_entities_predict_ner_finds(ner_export, tmp_path):
    """On the sentences the model learned, each sub-token predicts its training label: with the default
    ``model.dataset.continuation_label: inside`` a ``B-X`` word's later sub-tokens are ``I-X``, so ``simple``, which
    groups sub-tokens, finds predict ner's entities (with every sub-token labelled ``B-X``, as NeMo labels them, it
    split each multi-piece word into one entity per piece); the pipeline's default (``none``: a tag per sub-token)
    grouped as BIO reads gives the same entities; ``first`` reads words at their first sub-token as predict does
    (same scores too)."""
    from transformers import AutoTokenizer

    from bio_megatron.tasks.ner_data import read_iob

    sentences = read_iob(TRAIN_FILE)[:N_TRAIN]
    texts = [" ".join(s.words) for s in sentences]
    ours = _predict_ner(ner_export["hf"], texts, tmp_path)
    # the premise: the model learned its training sentences (else sub-tokens may disagree with their word's tag)
    assert [[(e["type"], e["start"], e["end"]) for e in doc] for doc in ours] == \
        [_gold_spans(s.words, s.tags) for s in sentences]
    (theirs,) = run_world(1, _pipeline_entities, str(ner_export["hf"]), ("none", "simple", "first"), texts)
    # what makes the comparison mean something: many entities, and entity words of several sub-tokens
    tok = AutoTokenizer.from_pretrained(ner_export["hf"])
    pieces = sum(len(tok.tokenize(text[e["start"]:e["end"]])) > 1 for doc, text in zip(ours, texts) for e in doc)
    assert len(ours) == N_TRAIN and sum(map(len, ours)) >= 12 and pieces >= 8, (sum(map(len, ours)), pieces)
    for strategy, pipe_docs in theirs.items():
        for text, mine, pipe in zip(texts, ours, pipe_docs, strict=True):
            assert [(e["type"], e["start"], e["end"]) for e in mine] == \
                [(e["type"], e["start"], e["end"]) for e in pipe], (strategy, text)
            if strategy == "first":
                assert all(abs(e["score"] - p["score"]) < 1e-4 for e, p in zip(mine, pipe)), text


def test_pretraining_export_card_loads_the_exported_class(pubmed_prefix, tmp_path):
    """A pretraining checkpoint's card: fill-mask, the corpus it read, and a snippet naming the folder's own class
    (an ELECTRA discriminator has no masked-LM head for AutoModelForMaskedLM to find) that runs offline."""
    from engine.pretrain_runs import overrides, pretrain_rank

    run_world(1, pretrain_rank, overrides(pubmed_prefix, tmp_path, "pt", steps=2, save_last=True))
    _export(tmp_path / "pt" / "checkpoints", tmp_path / "hf", 0o022)
    meta, body = _front_matter((tmp_path / "hf" / "README.md").read_text(encoding="utf-8"))
    assert meta["pipeline_tag"] == "fill-mask" and "pretraining" in meta["tags"] and "model-index" not in meta
    assert f"`{pubmed_prefix}`" in body
    cls = json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"][0]
    snippet = body.split("```python\n", 1)[1].split("```", 1)[0].replace("PATH_OR_HUB_ID", str(tmp_path / "hf"))
    assert f"{cls}.from_pretrained" in snippet
    done = subprocess.run([sys.executable, "-c", snippet + "\nprint(type(model).__name__)\n"], capture_output=True,
                          text=True, timeout=300, env=OFFLINE)
    assert done.returncode == 0 and done.stdout.strip().endswith(cls), done.stderr[-2000:]


def test_overwrite_refuses_a_model_card_the_user_edited(ner_export):
    """Users fill in model cards: ``--overwrite`` of an export whose README.md is no longer the card we wrote is
    one line, exit 2, the folder untouched; the unedited card is replaced as before."""
    from reliability.files import tree_digest

    out = ner_export["tmp"] / "edited"
    shutil.copytree(ner_export["hf"], out)
    argv = ["export", "hf", "--checkpoint", str(ner_export["ckpt"]), "--out", str(out), "--overwrite"]
    done = cli_forked(argv, env=OFFLINE_VARS)
    assert done.returncode == 0, done.stderr[-2000:]  # our own card: replaced
    card = out / "README.md"
    card.write_text(card.read_text(encoding="utf-8") + "\n## Intended use\nResearch only.\n", encoding="utf-8")
    before = tree_digest(out)
    done = cli_forked(argv, env=OFFLINE_VARS)
    assert done.returncode == 2 and f"{card}: edited since" in done.stderr, done.stderr[-2000:]
    assert tree_digest(out) == before
