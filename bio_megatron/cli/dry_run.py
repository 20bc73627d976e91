"""``pretrain --dry-run`` and ``finetune <task> --dry-run``: a pre-flight that reads what the run would read.

First every path the run reads is checked for existence and kind (:mod:`bio_megatron.config.preflight`); then,
for the paths that passed, the run's own readers look inside (the vocabulary, the corpus prefixes against it, the
restore source and, for fine-tuning, the task's train and dev data). Every problem found is reported together
(one line each, exit 2). A clean dry run prints the resolved config, the effective model shape (a restored
checkpoint's, not the recipe's ``size``), the data it reads, the exact parameter count, the static memory per
rank and the length of the run in steps and epochs.
"""

from __future__ import annotations

from pathlib import Path

from bio_megatron.config.loader import to_dict
from bio_megatron.config.preflight import (finetune_path_problems, pretrain_path_problems, raise_problems,
                                           vocab_problem)
from bio_megatron.config.sizes import padded_vocab_size, size_row
from bio_megatron.utils.errors import BioMegatronError, ConfigError

SKIP_HELP = ("with --dry-run: validate the config only, without looking at its paths (e.g. on a login node where "
             "the data is not mounted)")


def _is_half(precision) -> bool:
    return str(precision).startswith(("bf16", "16"))


def _shape(m, source: str) -> dict:
    """The effective encoder shape, named by its size-table row where it is one (else ``custom``)."""
    s = m.shape()
    dims = (s.num_layers, s.hidden_size, s.num_attention_heads, s.ffn_hidden_size)
    return {"size": size_row(s), "num_layers": dims[0], "hidden_size": dims[1], "num_attention_heads": dims[2],
            "ffn_hidden_size": dims[3], "max_position_embeddings": m.max_position_embeddings,
            "transformer_block_type": m.transformer_block_type, "family": getattr(m, "family", None), "from": source}


def _memory(m, t, padded: int, world_size: int) -> dict:
    """The static state per rank at the planned world: the launched one, else ``trainer.devices x num_nodes``
    (a dry run is one process; the job it checks may have many)."""
    from bio_megatron.training.memory import estimate

    if world_size <= 1 and isinstance(t.devices, int):
        world_size = t.devices * t.num_nodes
    dp = max(1, world_size // (m.tensor_model_parallel_size * m.pipeline_model_parallel_size))
    return {**estimate(m, padded, _is_half(t.precision), dp).as_dict(), "data_parallel_size": dp}


def _corpus(cfg) -> dict:
    """Each prefix of the blend: documents and tokens (read from its ``.idx``), weight."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from bio_megatron.config.pretrain import data_blend

    prefixes, weights = data_blend(cfg.model.data)
    out = []
    for i, p in enumerate(prefixes):
        ds = IndexedDataset(p)
        out.append({"prefix": p, "weight": weights[i] if weights else 1.0,
                    "documents": int(len(ds.document_indices) - 1), "tokens": int(ds.sequence_lengths.sum())})
    return {"prefixes": out, "tokens": sum(d["tokens"] for d in out)}


def _tracker_problems(cfg) -> list[str]:
    """The W&B / MLflow settings as the run checks them on every rank (keys, packages installed); nothing opened."""
    from bio_megatron.training.trackers import open_trackers

    try:
        open_trackers(cfg, Path(cfg.run_dir), False, {})
    except ConfigError as exc:
        return exc.problems
    return []


def pretrain_report(cfg, world_size: int, check_paths: bool = True) -> dict:
    """What ``pretrain --dry-run`` prints (raises one ConfigError listing every problem found)."""
    from bio_megatron.config.family_keys import electra_shapes
    from bio_megatron.data.pretrain import check_prefixes, load_tokenizer
    from bio_megatron.families import family_of_model
    from bio_megatron.vocab.builtin import resolve_vocab

    m, t = cfg.model, cfg.trainer
    vocab_path = resolve_vocab(m.tokenizer.vocab_file)
    problems = pretrain_path_problems(cfg, vocab_path) if check_paths else []
    bad = {p.split(":", 1)[0] for p in problems}
    tokenizer = None
    if "model.tokenizer.vocab_file" not in bad:
        try:
            tokenizer = load_tokenizer(cfg)
        except BioMegatronError as exc:
            if not check_paths:
                raise
            problems.append(f"model.tokenizer.vocab_file: {exc}")
    if check_paths and tokenizer is not None:
        if not any(k.startswith("model.data.data_prefix") for k in bad):
            try:  # ids inside the vocabulary, and the data's record naming this vocabulary
                check_prefixes(cfg, tokenizer.vocab_size, tokenizer)
            except BioMegatronError as exc:
                problems.append(f"model.data.data_prefix: {exc}")
        if m.restore_from_path and "model.restore_from_path" not in bad:
            from bio_megatron.training import checkpoint_dir as ckpt_dir
            from bio_megatron.training.resume_checks import check_compatible

            try:  # pretraining continues only from the same shape, vocabulary and family: refused now, not later
                check_compatible(Path(ckpt_dir.read_metadata(m.restore_from_path)["path"]), cfg, tokenizer.vocab_file,
                                 "restore")
            except BioMegatronError as exc:
                problems.append(f"model.restore_from_path: {exc}")
    raise_problems(problems + _tracker_problems(cfg))
    vocab = tokenizer.vocab_size
    padded = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    n = family_of_model(m).parameter_count(m, padded)  # each family counts its own model exactly
    extra = {"generator": electra_shapes(m).__dict__} if m.objective == "electra" else {}
    source = f"model.restore_from_path {m.restore_from_path} (checked to match)" if m.restore_from_path else \
        f"model.size {m.size}" + (" with overrides" if m.shape().status == "custom" else "")
    sequences = t.max_steps * m.global_batch_size
    schedule = {"max_steps": t.max_steps, "global_batch_size": m.global_batch_size,
                "seq_length": m.encoder_seq_length, "sequences": sequences,
                "tokens": sequences * m.encoder_seq_length}
    report = {"config": to_dict(cfg), "vocab_size": vocab, "padded_vocab_size": padded, "parameters": n,
              "shape_status": m.shape().status, "model_shape": _shape(m, source), **extra,
              "memory": _memory(m, t, padded, world_size), "schedule": schedule}
    if check_paths:
        corpus = _corpus(cfg)
        report["data"] = corpus
        split = [float(x) for x in str(m.data.splits_string).replace("/", ",").split(",") if x.strip()]
        train_tokens = corpus["tokens"] * (split[0] / sum(split) if split and sum(split) > 0 else 1.0)
        if train_tokens > 0:  # samples are packed to seq_length, so tokens / training tokens ~ passes over the data
            schedule["epochs_approx"] = round(schedule["tokens"] / train_tokens, 3)
    return report


def finetune_report(cfg, world_size: int, check_paths: bool = True) -> dict:
    """What ``finetune <task> --dry-run`` prints: the run's own pre-distributed set-up (restore source, tokenizer,
    train, dev and test data read) after the path checks (raises one ConfigError listing every problem found)."""
    from bio_megatron.families import family_of_model
    from bio_megatron.formats.fill import task_padded_vocab
    from bio_megatron.tasks.finetune import prepare
    from bio_megatron.tasks.finetune_steps import steps_per_epoch
    from bio_megatron.vocab.builtin import resolve_vocab

    m, t = cfg.model, cfg.trainer
    if not check_paths:  # nothing read: the recipe's own shape
        return {"config": to_dict(cfg), "model_shape": _shape(m, f"model.size {m.size}")}
    problems = finetune_path_problems(cfg)
    restore_bad = any(p.startswith("model.restore_from_path") for p in problems)
    src = None
    if m.restore_from_path and not restore_bad:
        from bio_megatron.formats.source import resolve_source

        try:
            src = resolve_source(m.restore_from_path)
        except BioMegatronError as exc:
            problems.append(f"model.restore_from_path: {exc}")
            restore_bad = True
    if (src is None or src.vocab_file is None) and not (m.restore_from_path and restore_bad):
        problems.append(vocab_problem("model.tokenizer.vocab_file", resolve_vocab(m.tokenizer.vocab_file)))
    raise_problems([p for p in problems if p] + _tracker_problems(cfg))
    # The run's own set-up, which reads the source again (cheap: inspected, not loaded) and the data.
    src, tokenizer, task, same_task = prepare(cfg, None)  # the layout is checked against the planned world, not 1
    padded = task_padded_vocab(m, tokenizer.vocab_size, src)
    head = sum(p.numel() for p in task.build_head(m).parameters())
    encoder = family_of_model(m).encoder_parameter_count(m, padded)  # each family counts its own encoder exactly
    n_train = len(task.train.features)
    per_epoch = steps_per_epoch(n_train, m.global_batch_size)
    steps = t.max_steps if t.max_steps > 0 else t.max_epochs * per_epoch
    source = f"model.restore_from_path {src.path} ({src.kind})" if src is not None else f"model.size {m.size}"
    dev = task.split("dev")
    # The run reads its test split only after training (nothing about it may reach training or selection), so a bad
    # test line would surface after the whole schedule: the dry run reads it now, to refuse it before any run.
    test = task.split("test")
    return {"config": to_dict(cfg), "model_shape": _shape(m, source),
            "restored": {"path": str(src.path), "kind": src.kind, "task": src.task,
                         "origin": str(src.origin) if src.origin else None,
                         "head": "encoder + head" if same_task else "encoder"} if src is not None else None,
            "vocab_size": tokenizer.vocab_size, "padded_vocab_size": padded,
            "vocab_file": str(tokenizer.vocab_file), "labels": task.labels,
            "parameters": encoder + head, "parameters_encoder": encoder, "parameters_head": head,
            "memory": _memory(m, t, padded, world_size),
            "data": {"data_dir": str(m.dataset.data_dir), "train_examples": n_train,
                     "dev_examples": len(dev.features) if dev is not None else None,
                     "test_examples": len(test.features) if test is not None else None,
                     **{f"{k}_file": str(Path(m.dataset.data_dir) / getattr(m.dataset, f"{k}_file"))
                        for k in ("train", "dev", "test") if getattr(m.dataset, f"{k}_file", None)}},
            "schedule": {"max_steps": steps, "steps_per_epoch": per_epoch,
                         "epochs": round(steps / per_epoch, 3), "global_batch_size": m.global_batch_size,
                         "val_every_steps": t.val_every(per_epoch)}}
