"""How fine-tuning cuts its data into micro-batches, on the real NER reader and tokenizer (tiny_ner's BC5CDR slice):
on the CPU a training step's micro-batches pad to its longest example and no further (rounding up to a multiple of 8 is for
a GPU's tensor cores, and only adds padded positions here); dev and test are predicted in groups of similar length,
shortest first, covering every example once; ``model.dataset.group_by_length`` trains an epoch on the same examples
with fewer padded positions; and the fp32 best checkpoint carries no optimizer state."""

from __future__ import annotations

import types

from ft_runs import ROOT, RECIPES, finetune_rank
from harness import run_world

FIXTURES = ROOT / "tests" / "fixtures" / "finetune"
DATA = [f"model.dataset.data_dir={FIXTURES}", "model.dataset.train_file=bc5cdr_chem_train_head.tsv",
        "model.dataset.dev_file=bc5cdr_chem_devel_head.tsv", "model.dataset.test_file=null",
        "model.dataset.format=iob", "model.dataset.max_train_examples=48", "model.dataset.max_eval_examples=40",
        "model.micro_batch_size=4", "model.global_batch_size=8"]


def _cut(over: list[str]) -> dict:
    from bio_megatron.config.finetune import load_finetune_config
    from bio_megatron.tasks.finetune import setup
    from bio_megatron.tasks.finetune_steps import PAD_MULTIPLE, Batches

    cfg = load_finetune_config("ner", RECIPES["ner"], over, 1)
    _, _, task, _, _, _, _ = setup(cfg)
    batches = Batches(task, cfg)
    batches.state = types.SimpleNamespace(seq_length=None)  # run_batches reads the step's width from it
    train = []
    for step in range(3):  # one width per step (the same on every rank): the step's longest example
        micros = batches.train(step)
        lengths = [task.length(task.train, i) for micro in micros for i in micro["index"].tolist()]
        train.append(({micro["input_ids"].shape[1] for micro in micros}, max(lengths)))
    dev = task.split("dev")
    groups = []
    for group in batches.eval_groups(dev, len(dev.features)):
        for micro in group:
            idx = [i for i in micro["index"].tolist() if i >= 0]
            groups.append((micro["input_ids"].shape[1], [task.length(dev, i) for i in idx], idx))
    epochs = {}  # a whole epoch's steps, plain shuffle and grouped by length (model.dataset.group_by_length)
    for grouped in (False, True):
        cfg.model.dataset.group_by_length = grouped
        cut = Batches(task, cfg)
        cut.state = batches.state
        steps = [[i for micro in cut.train(s) for i in micro["index"].tolist()] for s in range(cut.steps_per_epoch)]
        epochs[grouped] = {"steps": steps, "positions": sum(len(ix) * max(task.length(task.train, i) for i in ix)
                                                            for ix in steps)}
    return {"pad_multiple": PAD_MULTIPLE, "train": train, "dev": groups, "n_dev": len(dev.features),
            "epochs": epochs, "tokens": sum(task.length(task.train, i) for i in range(len(task.train.features)))}


def test_cpu_micro_batches_pad_to_their_longest_and_eval_groups_go_by_length():
    (got,) = run_world(1, _cut, DATA)
    assert got["pad_multiple"] == 1  # no CUDA here
    assert len(got["train"]) == 3 and all(widths == {longest} for widths, longest in got["train"]), got["train"]
    assert any(longest % 8 for _, longest in got["train"])  # what the old rounding to 8 would have padded
    order = [i for _, _, idx in got["dev"] for i in idx]
    assert sorted(order) == list(range(got["n_dev"]))  # every dev example once
    lengths = [n for _, ns, _ in got["dev"] for n in ns]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]  # shortest first
    assert all(width == max(ns) for width, ns, _ in got["dev"])
    # group_by_length: the epoch trains on the same examples as the plain shuffle, with far fewer padded positions
    plain, grouped = got["epochs"][False], got["epochs"][True]
    assert sorted(i for s in grouped["steps"] for i in s) == sorted(i for s in plain["steps"] for i in s)
    assert grouped["steps"] != plain["steps"]
    assert grouped["positions"] < 0.8 * plain["positions"], (grouped["positions"], plain["positions"], got["tokens"])


def test_fp32_best_checkpoint_has_weights_without_optimizer_state(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    (res,) = run_world(1, finetune_rank, "ner", DATA + ["trainer.max_steps=2", "trainer.val_check_interval=2",
                                                         f"exp_manager.exp_dir={tmp_path}", "exp_manager.name=run"])
    keys = set(FileSystemReader(res["checkpoint"]).read_metadata().state_dict_metadata)
    assert any(k.startswith("encoder.") or ".layers." in k for k in keys), sorted(keys)[:10]
    assert not [k for k in keys if k.startswith("optimizer")], sorted(k for k in keys if "optim" in k)[:10]
