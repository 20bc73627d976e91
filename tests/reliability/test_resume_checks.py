"""What a resumed run must share with its checkpoint, and what may change.

A tiny 1-rank run saves iteration 2; each case copies that run directory and resumes it through the real CLI
(``bio-megatron pretrain`` in a forked one-rank world) with one setting changed:

- a vocabulary file of the same path and size with two tokens swapped is refused (by content, sha256);
- another LR, another shape: one line naming the key and both values, exit 2, the checkpoint untouched;
- a longer ``trainer.max_steps`` with another micro-batch size still resumes and finishes, its LR decay re-planned
  over the new length (a fixed ``decay_steps`` stays); ``model.optim.sched.override_opt_param_scheduler`` takes
  another LR schedule from the config;
- continued pretraining (``model.restore_from_path``) of another shape is refused the same way;
- a checkpoint without ``checksums.json`` loads with a warning and stays without one; the next save records
  that its state came from an unverified checkpoint.
"""

from __future__ import annotations

import json
import math
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
    """Another LR on resume: one line with both values and each way on, the overrides as they paste into a shell
    (the runs folder has a space: the restore path was printed unquoted)."""
    import shlex

    from bio_megatron.training.resume_checks import OVERRIDE

    runs = tmp_path / "my runs"
    run, vocab = _copy_run(source, runs)
    line = _refused(pubmed_prefix, runs, vocab, "model.optim.lr=0.0005")
    saved = json.loads(json.dumps(__import__("yaml").safe_load(
        (run / "checkpoints" / "iter_0000002" / "config.yaml").read_text())))["model"]["optim"]["lr"]
    assert f"model.optim.lr is 0.0005 in this run's config but {saved!r} in the checkpoint's" in line, line
    assert "exp_manager.resume_if_exists=false" in line, line
    restore = line.split("with a fresh optimizer: ", 1)[1].split("; or take this run's LR schedule with ", 1)
    assert shlex.split(restore[0]) == [f"model.restore_from_path={run / 'checkpoints' / 'iter_0000002'}"], line
    assert restore[1].startswith(f"{OVERRIDE} "), line  # the key that takes the new LR instead


@pytest.mark.parametrize("change,key", [("model.num_layers=2", "model.num_layers"),
                                        ("model.transformer_block_type=post_ln", "model.transformer_block_type")])
def test_shape_or_family_change_is_refused(change, key, source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    line = _refused(pubmed_prefix, tmp_path, vocab, change)
    assert f"{key} is " in line and "in the checkpoint's" in line, line


def _lrs(run: Path) -> dict[int, float]:
    """step -> the LR metrics.jsonl recorded (a resumed run's later record wins)."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in recs if "lr" in r}


def _cosine(step: int, decay_steps: int, max_lr: float = 1e-3, min_lr: float = 1e-4) -> float:
    """megatron-core's cosine decay (no warm-up: tiny.yaml's 5% of 2 or 4 steps rounds to 0) at ``step``."""
    return min_lr + 0.5 * (math.cos(math.pi * min(step, decay_steps) / decay_steps) + 1) * (max_lr - min_lr)


def test_max_steps_extension_and_micro_batch_still_resume(source, pubmed_prefix, tmp_path):
    run, vocab = _copy_run(source, tmp_path)
    before = _lrs(run)
    rc, log = _resume(pubmed_prefix, tmp_path, vocab, "model.micro_batch_size=4")
    assert rc == 0, log[-3000:]
    assert "resumed from" in log
    assert "trainer.max_steps is 4, the checkpoint's run had 2: the LR decay is re-planned to end at step 4" in log
    assert json.loads((run / "status.json").read_text()) == {"state": "finished", "step": 4}
    assert (run / "checkpoints" / "latest").read_text().strip() == "4"
    # the rule (docs/RELIABILITY.md): the decay follows the new max_steps, so the LR at each resumed step is what a
    # run planned for 4 steps has there; the checkpoint's 2-step schedule would have pinned it at min_lr (1e-4)
    lrs = _lrs(run)
    assert lrs[1] == before[1] and lrs[2] == before[2]
    offset = next(k for k in (0, 1) if math.isclose(before[2], _cosine(2 - k, 2), rel_tol=1e-6))
    for step in (3, 4):
        assert math.isclose(lrs[step], _cosine(step - offset, 4), rel_tol=1e-6), (step, lrs, offset)
    assert lrs[3] > 2e-4


def test_a_fixed_decay_length_is_kept_on_extension(source, pubmed_prefix, tmp_path):
    """``model.optim.sched.decay_steps`` names the decay's end: extending max_steps does not move it."""
    run, vocab = _copy_run(source, tmp_path)
    # the source run had no decay_steps (it decayed over its 2 steps); the override lets this run fix it at 2
    rc, log = _resume(pubmed_prefix, tmp_path, vocab, "model.optim.sched.decay_steps=2",
                      "model.optim.sched.override_opt_param_scheduler=true")
    assert rc == 0, log[-3000:]
    lrs = _lrs(run)
    assert math.isclose(lrs[3], 1e-4, rel_tol=1e-6) and math.isclose(lrs[4], 1e-4, rel_tol=1e-6), lrs


def test_override_opt_param_scheduler_takes_the_configs_schedule(source, pubmed_prefix, tmp_path):
    """Megatron-LM's --override-opt_param-scheduler: another LR on resume is refused with the key named, and with
    the key the run takes its config's LR schedule (only the step count comes from the checkpoint)."""
    run, vocab = _copy_run(source, tmp_path)
    line = _refused(pubmed_prefix, tmp_path, vocab, "model.optim.lr=0.002")
    assert "model.optim.sched.override_opt_param_scheduler=true" in line, line
    before = _lrs(run)
    rc, log = _resume(pubmed_prefix, tmp_path, vocab, "model.optim.lr=0.002", "model.optim.sched.min_lr=0.0005",
                      "model.optim.sched.override_opt_param_scheduler=true")
    assert rc == 0, log[-3000:]
    lrs = _lrs(run)
    offset = next(k for k in (0, 1) if math.isclose(before[2], _cosine(2 - k, 2), rel_tol=1e-6))
    for step in (3, 4):
        assert math.isclose(lrs[step], _cosine(step - offset, 4, 2e-3, 5e-4), rel_tol=1e-6), (step, lrs, offset)


def test_restore_from_path_of_another_shape_is_refused(source, pubmed_prefix, tmp_path):
    src, vocab = source
    line = _refused(pubmed_prefix, tmp_path, vocab, f"model.restore_from_path={src / 'checkpoints'}",
                    "model.hidden_size=128", "model.num_attention_heads=4")
    assert "cannot restore from checkpoint" in line and "model.hidden_size is 128" in line, line


def test_a_nemo_config_restoring_a_checkpoint_takes_its_shape(source, tmp_path, capsys):
    """NeMo 1.x's token_classification_config names bert-base-uncased; a NeMo user fine-tunes their own pretraining
    run with it (``model.restore_from_path``, a checkpoint recording only ``size: tiny``). The run builds the
    checkpoint's shape, not the name's 12 x 768 (the dry run showed 12 x 768 "from model.restore_from_path" and the
    run died at the load: "Global shape mismatch ... (12, 768)"), and says the name has no effect."""
    import logging

    from bio_megatron.cli import main
    from reliability.cli_log import project_records

    src, _ = source
    data = tmp_path / "ner"
    data.mkdir()
    for split in ("train", "dev"):
        (data / f"text_{split}.txt").write_text("Aspirin lowers fever .\nNo drug here .\n")
        (data / f"labels_{split}.txt").write_text("B-Chemical O O O\nO O O O\n")
    nemo = Path(__file__).resolve().parents[1] / "fixtures" / "nemo_configs" / "v1"
    capsys.readouterr()
    with project_records(logging.WARNING) as records:
        rc = main(["finetune", "ner", "--config", str(nemo / "token_classification_config.v1.0.0.yaml"), "--dry-run",
                   "trainer.gpus=0", f"model.dataset.data_dir={data}", f"model.restore_from_path={src / 'checkpoints'}",
                   "model.dataset.max_seq_length=64", f"exp_manager.exp_dir={tmp_path / 'runs'}"])
    messages = "\n".join(r.getMessage() for r in records)
    assert rc == 0, messages
    shape = json.loads(capsys.readouterr().out)["model_shape"]
    assert (shape["size"], shape["num_layers"], shape["hidden_size"]) == ("tiny", 4, 64), shape
    assert "model.language_model.pretrained_model_name: the encoder's shape and weights come from " \
           "model.restore_from_path" in messages, messages


def test_a_config_naming_its_own_dimensions_takes_the_restored_checkpoints(source, tmp_path, capsys):
    """A fine-tuning config that spells out dimensions (``model.num_layers=2 model.hidden_size=32``) restoring a
    checkpoint that records only ``size: tiny`` builds the checkpoint's 4 x 64 (the size's dimensions are the
    checkpoint's shape too), not a 2 x 32 that the load would refuse."""
    from bio_megatron.cli import main

    src, _ = source
    data = tmp_path / "ner"
    data.mkdir()
    for split in ("train", "devel"):
        (data / f"{split}.tsv").write_text("Aspirin\tB-Chemical\nlowers\tO\nfever\tO\n.\tO\n\nNo\tO\ndrug\tO\n.\tO\n")
    capsys.readouterr()
    rc = main(["finetune", "ner", "--config", "bc5cdr_chem", "--dry-run", f"model.dataset.data_dir={data}",
               "model.dataset.test_file=null", "model.dataset.max_seq_length=64",
               f"model.restore_from_path={src / 'checkpoints'}",
               "model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=2",
               f"exp_manager.exp_dir={tmp_path / 'runs'}"])
    assert rc == 0
    shape = json.loads(capsys.readouterr().out)["model_shape"]
    assert (shape["size"], shape["num_layers"], shape["hidden_size"], shape["num_attention_heads"]) == \
        ("tiny", 4, 64, 4), shape


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


def _refused_finetune(over: list[str]) -> tuple[str, bool]:
    """The refusal's message, and whether the signal handlers are this process's own again afterwards (a run
    that fails before training must not keep its stop handlers: they would swallow a later SIGTERM)."""
    import signal

    from bio_megatron.utils.errors import CheckpointError

    stops = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    before = [signal.getsignal(s) for s in stops]
    try:
        _finetune(over)
    except CheckpointError as exc:
        return f"CheckpointError: {exc}", [signal.getsignal(s) for s in stops] == before
    return "no error", False


def test_finetuning_resume_with_another_lr_is_refused(tmp_path):
    over = ["trainer.max_steps=6", "trainer.val_check_interval=2", "model.dataset.max_eval_examples=16",
            "model.dataset.test_file=null", f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=cut"]
    assert run_world(1, _finetune_stopped_after, over, 2)[0]["status"] == "interrupted"
    resume = tmp_path / "cut" / "resume"
    before = tree_digest(resume)
    ((text, handlers_kept),) = run_world(1, _refused_finetune, over + ["model.optim.lr=0.123"])
    assert handlers_kept
    assert "CheckpointError: cannot resume from checkpoint" in text and "model.optim.lr is 0.123" in text, text
    assert "exp_manager.resume_if_exists=false" in text, text
    assert "model.optim.sched.override_opt_param_scheduler=true" in text, text  # the key that takes the new LR
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
