"""What a resumed run must share with its checkpoint, and what may change.

A tiny 1-rank run saves iteration 2; each case copies that run directory and resumes it through the real CLI
(``bio-megatron pretrain`` in a forked one-rank world) with one setting changed:

- a vocabulary file of the same path and size with two tokens swapped is refused (by content, sha256);
- another LR, another shape: one line naming the key and both values, exit 2, the checkpoint untouched;
- a longer ``trainer.max_steps`` with another micro-batch size still resumes and finishes;
- continued pretraining (``model.restore_from_path``) of another shape is refused the same way;
- a checkpoint without ``checksums.json`` loads with a warning and stays without one; the next save records
  that its state came from an unverified checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harness import run_world

from engine.pretrain_runs import TINY, overrides, pretrain_rank
from reliability.files import tree_digest
from reliability.test_checkpoint_integrity import run_cli


@pytest.fixture(scope="module")
def source(pubmed_prefix, tmp_path_factory) -> tuple[Path, Path]:
    """A run directory with iteration 2 (trained with a copy of the bundled vocabulary) and that vocabulary."""
    from bio_megatron.vocab.builtin import resolve_vocab

    root = tmp_path_factory.mktemp("resume_checks")
    vocab = root / "vocab.txt"
    shutil.copyfile(resolve_vocab("bert_base_uncased"), vocab)
    run_world(1, pretrain_rank, overrides(pubmed_prefix, root, "src", steps=2, save_last=True,
                                          extra=(f"model.tokenizer.vocab_file={vocab}",)))
    assert (root / "src" / "checkpoints" / "latest").read_text().strip() == "2"
    return root / "src", vocab


def _copy_run(source: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the source run (named ``run``) and of its vocabulary, under ``tmp_path``."""
    src, vocab = source
    shutil.copytree(src, tmp_path / "run", ignore=shutil.ignore_patterns("run.lock"))
    shutil.copyfile(vocab, tmp_path / "vocab.txt")
    return tmp_path / "run", tmp_path / "vocab.txt"


def _resume(pubmed_prefix, tmp_path: Path, vocab: Path, *extra: str, steps: int = 4) -> tuple[int, str]:
    argv = ["pretrain", "--config", str(TINY),
            *overrides(pubmed_prefix, tmp_path, "run", steps=steps, save_last=True,
                       extra=(f"model.tokenizer.vocab_file={vocab}", *extra))]
    return run_cli(argv, tmp_path / "cli.log")


def _error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if " ERROR " in line]
    assert len(lines) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    return lines[0]


def _state(run: Path) -> tuple:
    status = run / "status.json"
    return tree_digest(run / "checkpoints"), status.read_text() if status.exists() else None


def _refused(pubmed_prefix, tmp_path: Path, vocab: Path, *extra: str) -> str:
    run = tmp_path / "run"
    before = _state(run)
    rc, log = _resume(pubmed_prefix, tmp_path, vocab, *extra)
    assert rc == 2, log[-3000:]
    assert _state(run) == before  # nothing saved, nothing rewritten
    return _error_line(log)


def test_same_size_permuted_vocabulary_is_refused(source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    tokens = vocab.read_text(encoding="utf-8").split("\n")
    i, j = tokens.index("the"), tokens.index("of")
    tokens[i], tokens[j] = tokens[j], tokens[i]
    size = vocab.stat().st_size
    vocab.write_text("\n".join(tokens), encoding="utf-8")
    assert vocab.stat().st_size == size  # same path, same size, same number of tokens: only the content differs
    line = _refused(pubmed_prefix, tmp_path, vocab)
    assert "model.tokenizer.vocab_file" in line and "differs in content" in line, line
    assert "same number of tokens" in line and "exp_manager.name" in line, line


def test_lr_change_on_resume_is_one_line(source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    line = _refused(pubmed_prefix, tmp_path, vocab, "model.optim.lr=0.0005")
    saved = json.loads(json.dumps(__import__("yaml").safe_load(
        (run / "checkpoints" / "iter_0000002" / "config.yaml").read_text())))["model"]["optim"]["lr"]
    assert f"model.optim.lr is 0.0005 in this run's config but {saved!r} in the checkpoint's" in line, line
    assert "exp_manager.resume_if_exists=false" in line and "model.restore_from_path=" in line, line


@pytest.mark.parametrize("change,key", [("model.num_layers=2", "model.num_layers"),
                                        ("model.transformer_block_type=post_ln", "model.transformer_block_type")])
def test_shape_or_family_change_is_refused(change, key, source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    line = _refused(pubmed_prefix, tmp_path, vocab, change)
    assert f"{key} is " in line and "in the checkpoint's" in line, line


def test_max_steps_extension_and_micro_batch_still_resume(source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    rc, log = _resume(pubmed_prefix, tmp_path, vocab, "model.micro_batch_size=4", "trainer.log_every_n_steps=2")
    assert rc == 0, log[-3000:]
    assert "resumed from" in log
    # allowed, but the restored LR schedule still decays over the checkpoint run's 2 steps: the log says so
    assert "trainer.max_steps is 4, the checkpoint's run had 2: the restored LR schedule keeps" in log, log[-3000:]
    assert json.loads((run / "status.json").read_text()) == {"state": "finished", "step": 4}
    assert (run / "checkpoints" / "latest").read_text().strip() == "4"


def test_restore_from_path_of_another_shape_is_refused(source, pubmed_prefix, tmp_path):
    src, vocab = source
    line = _refused(pubmed_prefix, tmp_path, vocab, f"model.restore_from_path={src / 'checkpoints'}",
                    "model.hidden_size=128", "model.num_attention_heads=4")
    assert "cannot restore from checkpoint" in line and "model.hidden_size is 128" in line, line


def test_checkpoint_without_manifest_is_never_reblessed(source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    old = run / "checkpoints" / "iter_0000002"
    (old / "checksums.json").unlink()
    before = tree_digest(old)
    rc, log = _resume(pubmed_prefix, tmp_path, vocab)
    assert rc == 0, log[-3000:]
    warnings = [line for line in log.splitlines() if " WARNING " in line and "checksums.json" in line]
    assert warnings and "cannot be verified" in warnings[0], log[-3000:]
    assert tree_digest(old) == before  # still no manifest: nothing vouches for files that were never verified
    new = run / "checkpoints" / "iter_0000004"
    meta = json.loads((new / "bio_megatron.json").read_text())
    assert meta["unverified_origin"] == str(old)
    listed = json.loads((new / "checksums.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in new.iterdir() if p.name != "checksums.json")


def _finetune_stopped_after(over: list[str], steps: int) -> dict:
    """A real NER fine-tuning whose stop flag is raised after ``steps`` optimizer steps (as SIGTERM would)."""
    import bio_megatron.tasks.finetune as ft
    from bio_megatron.training.signals import StopRequest
    from finetune.ft_runs import finetune_rank

    class StopAt(StopRequest):
        calls = 0

        def agreed(self) -> bool:
            StopAt.calls += 1
            return StopAt.calls >= steps or super().agreed()

    ft.StopRequest = StopAt
    return finetune_rank("ner", over)


def _finetune(over: list[str]) -> dict:
    from finetune.ft_runs import finetune_rank

    return finetune_rank("ner", over)


def test_finetuning_resume_with_another_lr_is_refused(tmp_path):
    over = ["trainer.max_steps=6", "trainer.val_check_interval=2", "model.dataset.max_eval_examples=16",
            "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=cut"]
    assert run_world(1, _finetune_stopped_after, over, 2)[0]["status"] == "interrupted"
    resume = tmp_path / "cut" / "resume"
    before = tree_digest(resume)
    with pytest.raises(RuntimeError) as info:
        run_world(1, _finetune, over + ["model.optim.lr=0.123"])
    text = str(info.value)
    assert "CheckpointError: cannot resume from checkpoint" in text and "model.optim.lr is 0.123" in text, text
    assert "exp_manager.resume_if_exists=false" in text, text
    assert tree_digest(resume) == before


@pytest.mark.parametrize("key,saved_value,why", [
    ("model.optim.bias_correction", False, "LAMB moments"),
    ("model.embedding_size", 32, "factorised embedding"),
])
def test_lamb_update_and_albert_embedding_are_compared(key, saved_value, why, tmp_path):
    """A LAMB run resumed with the other bias-correction setting, or ALBERT with another embedding width, is named
    as a mismatch (the generic check reads CHECKED; these rows came with LAMB and ALBERT)."""
    import yaml

    from bio_megatron.config.loader import to_dict
    from bio_megatron.config.pretrain import PretrainConfig
    from bio_megatron.training.resume_checks import mismatches

    cfg = PretrainConfig()
    cfg.model.size, cfg.model.optim.name = "tiny", "lamb"
    saved = to_dict(cfg)
    section, _, leaf = key.rpartition(".")
    node = saved
    for part in section.split("."):
        node = node[part]
    node[leaf] = saved_value
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    found = {k: w for k, _, _, w in mismatches(tmp_path, cfg, weights_only=False)}
    assert key in found and why in found[key], found
