"""ALBERT pretraining through the real pretraining path (``tiny_albert`` recipe, megatron-core's BERT samples with
SOP and n-gram masking): the MLM + SOP loss falls, TP2 and DP2 + distributed optimizer give the TP1 losses (weights
are initialised per global key, so layouts start equal; the shared layer is split over TP by megatron-core, the
factorised embedding's projection is replicated), pipeline parallelism is refused at config time, and a run
stopped at a checkpoint resumes to the uninterrupted run's losses."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import run_world
from layouts import (LAYOUTS, assert_layout_matches, assert_resumes_exactly, pipeline_refusal, pretrain_rank,
                     reference_run)

from engine.pretrain_runs import losses, overrides

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_albert.yaml"
STEPS = 20


def albert_rank(over: list[str]) -> dict:
    """One forked rank of ``bio-megatron pretrain --config tiny_albert`` (the CLI path minus argument parsing)."""
    return pretrain_rank(RECIPE, over)


@pytest.fixture(scope="module")
def reference(pubmed_prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("albert_layouts")
    return root, reference_run(albert_rank, pubmed_prefix, root, STEPS)


def test_tiny_albert_mlm_and_sop_loss_falls(reference):
    root, ref = reference
    config = (root / "tp1" / "checkpoints").rglob("config.yaml")
    assert any("family: albert" in p.read_text() for p in config)
    # MLM (ln 28,996 ~ 10.3 at the start) + SOP (ln 2): the optimizer moves the shared layer and both heads
    first, last = (sum(ref[s] for s in steps) / 3 for steps in (range(1, 4), range(STEPS - 2, STEPS + 1)))
    assert 10.5 < first < 11.5, ref
    assert last < first - 0.5, ref


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_albert_layout_matches_tp1(name, reference, pubmed_prefix):
    root, ref = reference
    assert_layout_matches(albert_rank, name, root, ref, pubmed_prefix, STEPS)


def test_albert_resumes_exactly_from_a_checkpoint(reference, pubmed_prefix):
    """Steps 11-20 resumed from the reference's step-10 checkpoint (model, optimizer, scheduler, data position)
    are the uninterrupted run's."""
    root, ref = reference
    assert_resumes_exactly(albert_rank, root, ref, pubmed_prefix, STEPS)


def test_pipeline_parallel_albert_is_refused_at_config_time(tmp_path):
    """PP 2: one line naming the key, the value and why (the shared layer), exit 2, nothing written."""
    line = pipeline_refusal(RECIPE, tmp_path)
    assert "albert" in line and "shared layer" in line, line


def _import_uncased_albert(root: str) -> dict:
    """A random HF AlbertForPreTraining of tiny_albert's shape (3 layers) over the demo corpus's uncased vocabulary,
    imported through the CLI."""
    import shutil

    import torch
    from transformers import AlbertConfig, AlbertForPreTraining

    from bio_megatron.cli import main

    vocab = Path(__file__).resolve().parents[2] / "bio_megatron" / "resources" / "vocab" / "bert_base_uncased_vocab.txt"
    cfg = AlbertConfig(vocab_size=sum(1 for _ in open(vocab, encoding="utf-8")), embedding_size=32, hidden_size=64,
                       num_hidden_layers=3, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                       initializer_range=1.0, architectures=["AlbertForPreTraining"])
    torch.manual_seed(0)
    AlbertForPreTraining(cfg).save_pretrained(f"{root}/hf")
    shutil.copyfile(vocab, f"{root}/hf/vocab.txt")
    # no --verify: logits this large differ from transformers' by more than its absolute 1e-4 (float32 rounding)
    return main(["import", "hf", "--model", f"{root}/hf", "--out", f"{root}/ckpt"])


def test_continued_pretraining_from_an_imported_albert(pubmed_prefix, tmp_path):
    """tiny_albert at the imported folder's shape continues from its weights (model.restore_from_path): HF's
    weights drawn with std 1 give a first loss far above a fresh model's ~11 (ln 30,522 + ln 2)."""
    assert run_world(1, _import_uncased_albert, str(tmp_path)) == [0]
    over = overrides(pubmed_prefix, tmp_path, "continued", steps=2, extra=(
        "model.num_layers=3", "model.ffn_hidden_size=128", "model.tokenizer.vocab_file=bert_base_uncased",
        f"model.restore_from_path={tmp_path / 'ckpt'}"))
    (res,) = run_world(1, albert_rank, over)
    got = losses(tmp_path / "continued")
    assert res["status"] == "finished" and sorted(got) == [1, 2], got
    assert got[1] > 15.0 and all(v == v for v in got.values()), got


def _count(binary_head: bool) -> tuple[int, int]:
    """(parameters of the built tiny_albert model at TP1, albert_parameter_count)."""
    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.models.albert import albert_parameter_count, build_albert_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    m = load_pretrain_config(RECIPE, [f"model.bert_binary_head={str(binary_head).lower()}"]).model
    model = build_albert_model(m, 30522)
    padded = padded_vocab_size(30522, m.make_vocab_size_divisible_by, 1)
    return sum(p.numel() for p in model.parameters()), albert_parameter_count(m, padded)


def test_parameter_count_is_the_models_and_the_dry_run_reports_it(pubmed_prefix):
    """The count that --dry-run and the memory check use is the built model's (the shared layer once), and
    biom_albert_xxlarge's dry run reports ALBERT-xxlarge's ~223 M, not twelve 4096-wide layers' ~2.4 B."""
    import contextlib
    import io
    import json

    from bio_megatron.cli import main

    for binary_head in (True, False):
        (counted,) = run_world(1, _count, binary_head)
        assert counted[0] == counted[1], (binary_head, counted)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["pretrain", "--config", str(RECIPE.with_name("biom_albert_xxlarge.yaml")), "--dry-run",
                   "model.tokenizer.vocab_file=bert_base_uncased", f"model.data.data_prefix=[{pubmed_prefix}]"])
    text = out.getvalue()
    assert rc == 0, text
    report = json.loads(text[text.index("{"):])
    assert 2.2e8 < report["parameters"] < 2.3e8, report["parameters"]
    assert report["memory"]["parameters_per_rank"] < report["parameters"] / 3  # TP 4 splits nearly all of it
