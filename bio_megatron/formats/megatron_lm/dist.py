"""Megatron-LM / megatron-core *distributed* checkpoints (``--ckpt-format torch_dist``, the default today).

What Megatron-LM's ``pretrain_bert.py`` writes (``megatron/training/checkpointing.py::save_checkpoint`` ->
``generate_state_dict`` -> ``megatron.core.dist_checkpointing.save``)::

    <dir>/latest_checkpointed_iteration.txt      "release" or an iteration number
    <dir>/iter_NNNNNNN/                          (or release/)
        __0_0.distcp, __1_0.distcp, ...          torch DCP shards, one or more per rank
        .metadata                                torch DCP metadata (a pickle)
        metadata.json                            {"sharded_backend": "torch_dist", ...}
        common.pt                                megatron-core <= 0.13 only: the non-tensor state, a pickle

The non-tensor ("common") state holds ``args`` (the training ``argparse.Namespace``), ``checkpoint_version``
(3.0), ``iteration`` and the scheduler state; newer megatron-core stores it inside the DCP shards as the object
``common_state/shard_0_1`` instead of ``common.pt``. Model tensors are stored under megatron-core ``BertModel``
names (``embedding.word_embeddings.weight``, ``encoder.layers.self_attention.linear_qkv.weight`` ...), at their
*global* shape: a layer's weights carry a leading ``num_layers`` axis, whatever TP/PP (or virtual pipeline) the
run used. Optimizer and RNG entries sit beside them and are not read.

Reading: ``.metadata`` through the allow-list unpickler of :mod:`bio_megatron.training.integrity`, the
common state through :func:`~bio_megatron.formats.safe_load.safe_torch_load` (its pickle names
``argparse.Namespace`` and megatron enums, which torch's plain weights-only list refuses), then only the
model tensors through ``torch.distributed.checkpoint.load`` at their full shape in this one process
(dist-checkpointing reshards: TP1 whatever the saved layout), with :func:`integrity.restricted_loading`.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import warnings
from pathlib import Path

import torch

from bio_megatron.formats.megatron_lm.state import args_problems, shape_of_state
from bio_megatron.formats.safe_load import safe_torch_load
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
COMMON_KEY = "common_state/shard_0_1"  # megatron-core's ShardedObject("common_state", ..., (1,), (0,)).unique_key
_ROOTS = ("embedding.", "encoder.", "lm_head.", "output_layer.", "pooler.", "binary_head.")
# Transformer Engine's spec fuses the LayerNorms into the next linear layer (Megatron-LM's default impl)
_TE_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
             "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
             "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
             "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}
_LAYER_OPS = ("input_layernorm", "self_attention.linear_qkv", "self_attention.linear_proj", "pre_mlp_layernorm",
              "mlp.linear_fc1", "mlp.linear_fc2")
_TOP = ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
        "embedding.tokentype_embeddings.weight", "encoder.final_layernorm.weight", "encoder.final_layernorm.bias",
        "pooler.dense.weight", "pooler.dense.bias", "lm_head.dense.weight", "lm_head.dense.bias",
        "lm_head.layer_norm.weight", "lm_head.layer_norm.bias", "output_layer.bias", "binary_head.weight",
        "binary_head.bias")


def is_dist_checkpoint(directory: Path) -> bool:
    """A dist-checkpointing directory (torch DCP ``.metadata``, megatron's ``metadata.json`` or ``common.pt``)."""
    return directory.is_dir() and any((directory / n).is_file() for n in (".metadata", "metadata.json", "common.pt"))


def _metadata(it: Path):
    from torch.distributed.checkpoint.metadata import Metadata

    from bio_megatron.training.integrity import UnsafePickle, load_metadata_safely

    config = it / "metadata.json"
    if config.is_file():
        try:
            backend = json.loads(config.read_text()).get("sharded_backend")
        except (OSError, ValueError, AttributeError):
            raise CheckpointError(f"{config}: unreadable") from None
        if backend != "torch_dist":  # zarr (megatron-core < 0.7) has no .metadata pickle: another reader
            raise CheckpointError(f"{it}: a {backend!r} distributed checkpoint; only torch_dist is read (convert "
                                  "it with Megatron-LM's tools/checkpoint/convert.py or re-save with torch_dist)")
    if not (it / ".metadata").is_file():
        raise CheckpointError(f"{it}: incomplete distributed checkpoint: .metadata is missing")
    try:
        with (it / ".metadata").open("rb") as fh:
            meta = load_metadata_safely(fh)
    except UnsafePickle as exc:
        raise CheckpointError(f"{it}/.metadata names {exc}, which no checkpoint contains; refusing to load it "
                              "(the file may have been crafted to run code)") from None
    except Exception as exc:  # EOFError, UnpicklingError...: a cut or scrambled pickle
        raise CheckpointError(f"{it}/.metadata cannot be read ({type(exc).__name__})") from None
    if not isinstance(meta, Metadata):
        raise CheckpointError(f"{it}/.metadata holds a {type(meta).__name__}, not torch checkpoint metadata")
    return meta


def _common_state(it: Path, meta) -> dict:
    """The non-tensor state: ``common.pt`` (older megatron-core) or the ``common_state`` object in the shards."""
    if (it / "common.pt").is_file():
        state = safe_torch_load(it / "common.pt")
    else:
        found = [(idx, info) for idx, info in meta.storage_data.items() if idx.fqn == COMMON_KEY]
        if not found:
            raise CheckpointError(f"{it}: neither common.pt nor a {COMMON_KEY} object: not a megatron-core "
                                  "distributed checkpoint (no args to read the model's shape from)")
        info = found[0][1]
        if info.transform_descriptors:
            raise CheckpointError(f"{it}: the common state is stored transformed ({info.transform_descriptors}); "
                                  "not supported")
        with (it / info.relative_path).open("rb") as fh:
            fh.seek(info.offset)
            blob = fh.read(info.length)
        if len(blob) != info.length:
            raise CheckpointError(f"{it}/{info.relative_path} is truncated (the common state is cut)")
        state = safe_torch_load(io.BytesIO(blob), f"{it}/{info.relative_path}:{COMMON_KEY}")
        state = state[0] if isinstance(state, list) and state else state  # megatron saves [data]
    if not isinstance(state, dict):
        raise CheckpointError(f"{it}: the common state is a {type(state).__name__}, not a dict")
    return state


def _our_name(fqn: str) -> str | None:
    """A stored model key -> our name (``{}`` marks a stacked layer axis), None for non-model entries."""
    name = fqn
    for prefix in ("model.", "module."):  # NeMo-style wrappers put the BertModel under an attribute
        if name.startswith(prefix) and name[len(prefix):].startswith(_ROOTS):
            name = name[len(prefix):]
    if not name.startswith(_ROOTS) or name.endswith("_extra_state"):
        return None
    layer = re.match(r"^encoder\.layers\.(?:(\d+)\.)?(.+)$", name)
    if layer:
        op = _TE_NAMES.get(layer.group(2), layer.group(2))
        if op.rsplit(".", 1)[0] not in _LAYER_OPS or not op.endswith((".weight", ".bias")):
            raise CheckpointError(f"unexpected weight {fqn} (not part of Megatron BERT's layer: qk_layernorm, "
                                  "experts or another architecture?)")
        return f"encoder.layers.{layer.group(1) if layer.group(1) else '{}'}.{op}"
    if name not in _TOP:
        raise CheckpointError(f"unexpected weight {fqn} (not part of megatron-core's BertModel)")
    return name


def _load_tensors(it: Path, meta) -> dict[str, torch.Tensor]:
    """Every model tensor at its full (global) shape, read through dist-checkpointing in this process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from bio_megatron.training.integrity import restricted_loading

    wanted: dict[str, torch.Tensor] = {}
    names: dict[str, str] = {}
    for fqn, md in meta.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        try:
            ours = _our_name(fqn)
        except CheckpointError as exc:
            raise CheckpointError(f"{it}: {exc}") from None
        if ours is not None:
            wanted[fqn] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
            names[fqn] = ours
    if not wanted:
        raise CheckpointError(f"{it}: no BERT model tensors in the checkpoint (keys: "
                              f"{sorted(meta.state_dict_metadata)[:6]})")
    try:
        with restricted_loading(), warnings.catch_warnings():
            # "load in a single process" is the point here, not something to warn a user about
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\.checkpoint")
            dcp.load(wanted, storage_reader=dcp.FileSystemReader(str(it)), no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException wraps per-rank failures
        text = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"{it}: cannot read the model tensors ({type(exc).__name__}: {text})") from None
    state: dict[str, torch.Tensor] = {}
    for fqn, tensor in wanted.items():
        name, tensor = names[fqn], tensor.float()
        if "{}" in name:  # stacked: one slice per layer along the leading axis
            for i in range(tensor.shape[0]):
                state[name.format(i)] = tensor[i].clone()
        else:
            state[name] = tensor
    return state


def read_dist(path: Path, it: Path, num_attention_heads: int | None = None) -> dict:
    """A torch_dist checkpoint as :func:`~bio_megatron.formats.megatron_lm.convert.read_shards` returns it."""
    where = str(it)
    meta = _metadata(it)
    common = _common_state(it, meta)
    if any(k.startswith("model") and k[5:].isdigit() for k in common):
        log.info("%s: a virtual-pipeline save (model0, model1, ...): layers are stored globally", where)
    args = common.get("args")
    a = vars(args) if isinstance(args, argparse.Namespace) else {}
    if not a:
        log.warning("%s: no training args in the common state; the shape is read from the weights", where)
    problems = args_problems(a, distributed=True)
    if problems:
        raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
    state = _load_tensors(it, meta)
    hidden = state["embedding.word_embeddings.weight"].shape[1] if "embedding.word_embeddings.weight" in state else 0
    heads = a.get("num_attention_heads") or num_attention_heads
    if heads is None:
        heads = max(1, hidden // 64)
        log.warning("%s has no args: assuming %d attention heads (64 per head); pass --num-attention-heads if "
                    "that is wrong", where, heads)
    tp = int(a.get("tensor_model_parallel_size") or 1)
    pp = int(a.get("pipeline_model_parallel_size") or 1)
    version = float(common.get("checkpoint_version") or a.get("checkpoint_version") or 3.0)
    return {"state": state, "args": a, "version": version, "tp": tp, "pp": pp, "heads": heads, "where": where,
            "iteration": common.get("iteration"), "shape": shape_of_state(state, a, heads, where),
            "format": "torch_dist"}
