"""``import megatron-lm`` / ``export megatron-lm``: Megatron-LM legacy BERT checkpoints <-> ours.

What Megatron-LM (and NGC, for BioMegatron and Megatron BERT 345m) ships::

    <dir>/latest_checkpointed_iteration.txt     "release" or an iteration number
    <dir>/release/ or iter_NNNNNNN/             one folder per saved iteration
        mp_rank_TT/model_optim_rng.pt           one file per tensor-parallel rank (PP 1)
        mp_rank_TT_PPP/model_optim_rng.pt       ... and pipeline stage
    MegatronBERT.pt, or a .zip around release/mp_rank_00/model_optim_rng.pt   (a single TP1 file)

Each file holds ``model`` (see :mod:`bio_megatron.formats.megatron_lm.state`), ``args`` (the training
``argparse.Namespace``: shape, padded vocabulary size, activation, ...), ``checkpoint_version`` (the QKV
layout) and ``iteration``; every file is read through :func:`~bio_megatron.formats.safe_load.safe_torch_load`.

Import reads the shape from ``args`` (and the weights where ``args`` is absent, as in the oldest files),
refuses what the engine cannot compute exactly (CheckpointError naming the setting), merges the TP/PP shards,
undoes the version's QKV layout, and writes a model-only checkpoint of ours (loadable at any layout).
Export loads our checkpoint (any saved layout) at TP1 and writes ``release/mp_rank_TT/model_optim_rng.pt``
for ``--tp`` ranks with ``checkpoint_version`` 3.0, plus the ``vocab.txt`` beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import torch

from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.formats.archives import archive_limit, check_zip, copy_member
from bio_megatron.formats.state import VOCAB_ROWS, ModelState, unpadded
from bio_megatron.formats.megatron_lm.state import (args_problems, fix_qkv, flatten, legacy_to_mcore,
                                                       mcore_to_legacy_shards, merge_pp, merge_tp, shape_of_state)
from bio_megatron.formats.safe_load import safe_torch_load
from bio_megatron.formats.source import Source
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import atomic_path, check_output_dir
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
TRACKER = "latest_checkpointed_iteration.txt"
EXPORT_COMMAND, IMPORT_COMMAND = "export megatron-lm", "import megatron-lm"  # names in each output's marker
_SHARD_RE = re.compile(r"(?:^|/)mp_rank_(\d{2})(?:_(\d{3}))?/model(?:_optim)?_rng\.pt$")
__all__ = ["export_megatron_lm", "fix_qkv", "import_megatron_lm", "megatron_bert_only", "read_megatron_lm",
           "read_shards"]


# --- finding and reading the shards -------------------------------------------------------------------
def _iteration_dir(root: Path) -> Path:
    tracker = root / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        if text == "release":
            return root / "release"
        if not text.isdigit():
            raise CheckpointError(f"{tracker}: expected 'release' or an iteration number, found {text!r}")
        return root / f"iter_{int(text):07d}"
    return root


def _shards(path: Path) -> tuple[dict[tuple[int, int], object], str]:
    """(tp, pp) -> a file path or zip member, and a label for messages."""
    if path.is_file() and zipfile.is_zipfile(path) and path.suffix == ".zip":
        # member count, declared sizes and compression ratios checked before anything is inflated
        found = {i.filename: _SHARD_RE.search(i.filename) for i in check_zip(path, str(path))}
        found = {m: r for m, r in found.items() if r}
        dirs = {m[: r.start()] for m, r in found.items()}
        if len(dirs) > 1:
            release = [d for d in dirs if d.rstrip("/").endswith("release")]
            if len(release) != 1:
                raise CheckpointError(f"{path}: several iterations inside ({sorted(dirs)}); unzip it and point at one")
            found = {m: r for m, r in found.items() if m.startswith(release[0])}
        if not found:
            raise CheckpointError(f"{path}: no mp_rank_*/model_optim_rng.pt inside the zip")
        return {(int(r.group(1)), int(r.group(2) or 0)): (path, m) for m, r in found.items()}, str(path)
    if path.is_file():
        return {(0, 0): path}, str(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such file or directory")
    it = _iteration_dir(path)
    out = {}
    for f in sorted(it.glob("mp_rank_*/model*_rng.pt")):
        r = _SHARD_RE.search(f.relative_to(it).as_posix())
        if r:
            out[(int(r.group(1)), int(r.group(2) or 0))] = f
    if not out:
        raise CheckpointError(f"{it}: no mp_rank_*/model_optim_rng.pt (expected a Megatron-LM checkpoint directory "
                              f"with {TRACKER}, a release/ or iter_NNNNNNN/ folder, or a single .pt/.zip file)")
    return out, str(it)


def _load(src: object) -> dict:
    if isinstance(src, tuple):  # (zip, member): streamed to a temporary file, never inflated into memory whole
        where, limit = f"{src[0]}:{src[1]}", archive_limit()
        with zipfile.ZipFile(src[0]) as zf, tempfile.NamedTemporaryFile(prefix="bio_megatron_zip_") as tmp:
            copy_member(zf, zf.getinfo(src[1]), tmp, where, limit)
            tmp.flush()
            return safe_torch_load(tmp.name, where)
    return safe_torch_load(src)


def _model_of(sd: dict, where: str) -> dict:
    if "model0" in sd:
        raise CheckpointError(f"{where}: a virtual-pipeline checkpoint (model0, model1, ...): not supported")
    model = sd.get("model", sd if "language_model" in sd else None)
    if not isinstance(model, dict):
        raise CheckpointError(f"{where}: no 'model' weights (keys: {sorted(sd)[:8]})")
    return model


def read_shards(path: str | Path, num_attention_heads: int | None = None) -> dict:
    """A Megatron-LM checkpoint's weights as ``{"state": our full TP1 state (Megatron's padded vocabulary rows),
    "shape": ModelConfig fields, "args", "version", "tp", "pp", ...}`` (legacy, or torch_dist through
    :func:`~bio_megatron.formats.megatron_lm.dist.read_dist`)."""
    path = Path(path)
    if path.is_dir():
        from bio_megatron.formats.megatron_lm.dist import is_dist_checkpoint, read_dist

        it = _iteration_dir(path)
        if is_dist_checkpoint(it):  # torch_dist (Megatron-LM's default --ckpt-format)
            return read_dist(path, it, num_attention_heads)
    shards, where = _shards(path)
    tp, pp = max(k[0] for k in shards) + 1, max(k[1] for k in shards) + 1
    missing = [f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp) for p in range(pp)
               if (t, p) not in shards]
    if missing:
        raise CheckpointError(f"{where}: shards {missing} are missing (found {tp} TP x {pp} PP ranks)")
    first = _load(shards[(0, 0)])
    a = vars(first["args"]) if isinstance(first.get("args"), argparse.Namespace) else {}
    version = float(first.get("checkpoint_version") or 0)
    problems = args_problems(a)
    if problems:
        raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
    saved_tp = a.get("tensor_model_parallel_size", a.get("model_parallel_size")) or tp
    if saved_tp != tp or (a.get("pipeline_model_parallel_size") or 1) != pp:
        raise CheckpointError(f"{where}: args say TP {saved_tp} x PP {a.get('pipeline_model_parallel_size') or 1} "
                              f"but the folder holds {tp} x {pp} shards")
    heads = a.get("num_attention_heads") or num_attention_heads
    stages = []
    for p in range(pp):
        parts = []
        for t in range(tp):
            sd = first if (t, p) == (0, 0) else _load(shards[(t, p)])
            flat = flatten(_model_of(sd, where))
            if heads is None:  # the oldest files have no args: Megatron BERT's published shapes use 64-wide heads
                heads = flat["language_model.embedding.word_embeddings.weight"].shape[1] // 64
                log.warning("%s has no args: assuming %d attention heads (64 per head); pass "
                            "--num-attention-heads if that is wrong", where, heads)
            if heads % tp:
                raise CheckpointError(f"{where}: num_attention_heads ({heads}) not divisible by its TP size ({tp})")
            parts.append(legacy_to_mcore(flat, version, heads // tp, where))
        stages.append(merge_tp(parts, where))
    state = merge_pp(stages)
    return {"state": state, "args": a, "version": version, "tp": tp, "pp": pp, "heads": heads, "where": where,
            "iteration": first.get("iteration"), "shape": shape_of_state(state, a, heads, where), "format": "legacy"}


# --- import -------------------------------------------------------------------------------------------
def _vocab_for(path: Path, vocab: str | Path | None) -> Path:
    if vocab is not None:
        if not Path(vocab).is_file():
            raise CheckpointError(f"{vocab}: vocabulary file not found")
        return Path(vocab)
    for d in ((path, _iteration_dir(path)) if path.is_dir() else (path.parent,)):
        if (d / "vocab.txt").is_file():
            return d / "vocab.txt"
    raise CheckpointError(f"{path}: Megatron-LM checkpoints carry no vocabulary; pass --vocab FILE "
                          "(the vocab.txt the model was trained with)")


def read_megatron_lm(checkpoint: str | Path, num_attention_heads: int | None = None,
                     vocab: str | Path | None = None) -> ModelState:
    """A Megatron-LM checkpoint (legacy or torch_dist) with its vocabulary (``vocab``, default the ``vocab.txt``
    beside it) as a :class:`ModelState`: Megatron BERT's pretraining model in our TP1 names, the real vocabulary
    rows; ``origin`` records the format, QKV version, saved layout and iteration. CheckpointError for a vocabulary
    that does not fit the embedding, or a binary head without its pooler."""
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    src = read_shards(checkpoint, num_attention_heads)
    a, state, where = src["args"], src["state"], src["where"]
    vocab_file = _vocab_for(Path(checkpoint), vocab)
    lower = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}.get(a.get("tokenizer_type"))
    tok = WordPieceTokenizer(vocab_file, lower)
    rows = state["embedding.word_embeddings.weight"].shape[0]
    divisible = int(a.get("make_vocab_size_divisible_by") or 128)
    expected = padded_vocab_size(tok.vocab_size, divisible, src["tp"])
    if rows != expected:
        raise CheckpointError(f"{where}: the embedding has {rows} rows, but {vocab_file} has {tok.vocab_size} "
                              f"entries, which Megatron pads to {expected} (multiple of {divisible} x TP {src['tp']}): "
                              "wrong vocabulary file?")
    binary = "binary_head.weight" in state
    if binary != ("pooler.dense.weight" in state):  # Megatron-LM builds the pooler exactly with the binary head
        raise CheckpointError(f"{where}: a binary head without a pooler (or the reverse): not Megatron-LM's BERT")
    m = ModelConfig(**src["shape"], bert_binary_head=binary, transformer_impl="local",
                    make_vocab_size_divisible_by=divisible, encoder_seq_length=src["shape"]["max_position_embeddings"])
    full = unpadded(state, tok.vocab_size)
    if "embedding.tokentype_embeddings.weight" not in full:  # trained without token types: zeros add nothing
        full["embedding.tokentype_embeddings.weight"] = torch.zeros(2, m.shape().hidden_size)
    if "lm_head.dense.weight" not in full:  # an encoder-only file: fine-tuning uses the encoder alone
        log.warning("%s has no LM head: the imported LM head is freshly initialised", where)
    info = {"format": src["format"], "checkpoint_version": src["version"], "tp": src["tp"], "pp": src["pp"],
            "iteration": src["iteration"]}
    return ModelState(full, m, "megatron_bert", vocab_file, tok.vocab_size, tok.lowercase, source=str(checkpoint),
                      origin={"megatron_lm": info})


def import_megatron_lm(checkpoint: str | Path, out: str | Path, vocab: str | Path | None = None,
                       num_attention_heads: int | None = None, overwrite: bool = False,
                       verify: bool = False, tolerance: float | None = None) -> dict:
    """Write a BioMegatron checkpoint (TP1, model weights only; loadable at any layout) from Megatron-LM's
    (legacy or torch_dist): :func:`read_megatron_lm`, then :func:`~bio_megatron.formats.ours.write_ours`. ``out``
    must be absent or empty, or (``overwrite``) an earlier ``import megatron-lm`` output. ``verify``: the
    converted source weights run by transformers' ``MegatronBertForPreTraining`` vs the written checkpoint on a
    padded batch; the result's ``verify`` holds the max absolute logit difference."""
    from bio_megatron.formats.ours import write_ours

    check_output_dir(out, IMPORT_COMMAND, overwrite)  # refuse before reading gigabytes
    state = read_megatron_lm(checkpoint, num_attention_heads, vocab)
    m, info = state.model, state.origin["megatron_lm"]

    def check(tmp: Path, full: dict) -> dict:
        # the reference holds the source's weights as read (and a fresh LM head as filled in), not our saved files
        from bio_megatron.formats.verify import FP32_TOLERANCE, hf_reference, verify_import

        reference = hf_reference(full, m.shape(), state.vocab_size, binary_head=state.binary_head,
                                 layernorm_epsilon=m.layernorm_epsilon,
                                 max_position_embeddings=m.max_position_embeddings,
                                 num_tokentypes=full["embedding.tokentype_embeddings.weight"].shape[0])
        return verify_import(reference, tmp, tolerance=FP32_TOLERANCE if tolerance is None else tolerance,
                             source=f"{state.source} via transformers MegatronBertForPreTraining")

    report = write_ours(state, out, IMPORT_COMMAND, overwrite, check if verify else None)
    shape = m.shape()
    result = {"out": str(out), "binary_head": state.binary_head, "vocab_size": state.vocab_size, **info,
              "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
              "num_attention_heads": shape.num_attention_heads}
    if report is not None:
        result["verify"] = report
        if not report["verified"]:
            result["out"] = None
            return result
    log.info("imported %s (Megatron-LM, version %s, TP %d x PP %d) -> %s", state.source, info["checkpoint_version"],
             info["tp"], info["pp"], out)
    return result


# --- export -------------------------------------------------------------------------------------------
def megatron_bert_only(holder: str) -> Callable[[Source], None]:
    """:func:`~bio_megatron.formats.ours.read_ours`'s ``accept`` for a format whose BERT is Megatron's pre-LN one
    (``holder`` names it): any other family is refused before a weight is read."""

    def accept(src: Source) -> None:
        from bio_megatron.families import family_named

        family = src.shape.get("family")
        block = src.shape.get("transformer_block_type") or family_named(family).block_type  # unrecorded: the family's
        if family != "megatron_bert" or block != "pre_ln":
            raise CheckpointError(f"{src.path}: a {family} model ({block}); {holder} holds the megatron_bert "
                                  "family only (pre-LN)")
    return accept


def _pretraining_megatron_bert(src: Source) -> None:
    if src.task is not None:
        raise CheckpointError(f"{src.path}: a fine-tuned ({src.task}) checkpoint; Megatron-LM's BERT holds the "
                              "pretraining heads only: export the pretraining checkpoint, or use export hf")
    megatron_bert_only("Megatron-LM's BERT")(src)


def _megatron_args(m, lowercase: bool | None, tp: int, padded: int, iteration: int) -> argparse.Namespace:
    """The fields Megatron-LM's ``load_args_from_checkpoint`` and transformers' converter read."""
    shape = m.shape()
    return argparse.Namespace(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads, kv_channels=shape.hidden_size // shape.num_attention_heads,
        num_query_groups=None, group_query_attention=False, seq_length=m.encoder_seq_length,
        encoder_seq_length=m.encoder_seq_length, max_position_embeddings=m.max_position_embeddings,
        position_embedding_type="learned_absolute", add_position_embedding=True,
        use_rotary_position_embeddings=False, rotary_percent=1.0, rotary_interleaved=False,
        add_bias_linear=True, add_qkv_bias=True, swiglu=False, openai_gelu=False, onnx_safe=None,
        untie_embeddings_and_output_weights=False, apply_layernorm_1p=False, normalization="LayerNorm",
        layernorm_epsilon=m.layernorm_epsilon, apply_residual_connection_post_layernorm=False,
        apply_query_key_layer_scaling=False, bert_binary_head=m.bert_binary_head,
        tokenizer_type="BertWordPieceLowerCase" if lowercase else "BertWordPieceCase",
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by, padded_vocab_size=padded,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        num_layers_per_virtual_pipeline_stage=None, model_parallel_size=tp, world_size=tp, data_parallel_size=1,
        hidden_dropout=0.1, attention_dropout=0.1, fp16=False, bf16=False, params_dtype=torch.float32,
        iteration=iteration, consumed_train_samples=0, consumed_valid_samples=0, no_save_optim=True,
        no_save_rng=True)


def export_megatron_lm(checkpoint: str | Path, out: str | Path, tp: int = 1, overwrite: bool = False) -> dict:
    """Write ``out/release/mp_rank_TT/model_optim_rng.pt`` (TP ``tp``) from our pretraining checkpoint.
    ``out`` must be absent or empty, or (``overwrite``) an earlier ``export megatron-lm`` output."""
    from bio_megatron.formats.ours import read_ours

    check_output_dir(out, EXPORT_COMMAND, overwrite)
    state = read_ours(checkpoint, accept=_pretraining_megatron_bert)
    m, vocab_size = state.model, state.vocab_size
    shape = m.shape()
    if tp < 1 or shape.num_attention_heads % tp or shape.ffn_hidden_size % tp:
        raise CheckpointError(f"--tp {tp}: must divide num_attention_heads ({shape.num_attention_heads}) and "
                              f"ffn_hidden_size ({shape.ffn_hidden_size})")
    full = dict(state.tensors)
    padded = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp)
    for key in VOCAB_ROWS:  # Megatron-LM expects its own padding for this TP size; the extra rows are unused
        t = full[key]
        full[key] = torch.cat([t, t.new_zeros((padded - vocab_size,) + tuple(t.shape[1:]))])
    iteration = int(json.loads((Path(state.source) / "bio_megatron.json").read_text()).get("iteration") or 0)
    args = _megatron_args(m, state.lowercase, tp, padded, iteration)
    with atomic_path(out, command=EXPORT_COMMAND, overwrite=overwrite) as tmp:
        for rank, model_sd in enumerate(mcore_to_legacy_shards(full, tp)):
            shard = tmp / "release" / f"mp_rank_{rank:02d}"
            shard.mkdir(parents=True)
            torch.save({"model": model_sd, "args": args, "checkpoint_version": 3.0, "iteration": iteration},
                       shard / "model_optim_rng.pt")
        (tmp / TRACKER).write_text("release\n")
        shutil.copyfile(state.vocab_file, tmp / "vocab.txt")
    log.info("exported %s -> %s (Megatron-LM legacy, TP %d, checkpoint_version 3.0)", state.source, out, tp)
    return {"out": str(out), "tp": tp, "checkpoint_version": 3.0, "binary_head": m.bert_binary_head,
            "padded_vocab_size": padded, "vocab_size": vocab_size, "iteration": iteration}
