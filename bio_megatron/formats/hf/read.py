"""A Hugging Face folder read back in our terms: which task class holds which head (and its settings), and the
folder's weights as a full TP1 megatron-core state. ``finetune`` / ``predict`` / ``import hf`` load HF folders
through it (``MegatronBert*`` / ``Bert*``, RoBERTa, an ELECTRA discriminator, ALBERT, ModernBERT, or the
remote-code ``BioMegatronFor*`` classes of :mod:`bio_megatron.formats.hf.modeling`); the writing half (class
choice, remote code, the folder) is the rest of this folder, :mod:`bio_megatron.formats.hf.convert`.

A head that equals one of transformers' fixed heads is the family's plain class (``MegatronBertFor*``,
``BertFor*``, ..., :mod:`bio_megatron.families`); every other NeMo MLP head is the remote-code ``BioMegatronFor*``
class, whose settings travel in ``config.json`` as ``bio_megatron_head`` and whose weights keep our own names
(``head.mlp.layer0.*``, ...).

This module sits below ``loading/`` (which fills models from it) and below :mod:`bio_megatron.formats.source`
(which inspects HF folders with its class table): it imports neither a source nor a loader, and transformers
nowhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.families import FAMILIES, Family, family_of_hf
from bio_megatron.formats.archives import check_zip_if_zip, shape_bound
from bio_megatron.models.hf_convert import check_config_tensors
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import load_json

if TYPE_CHECKING:
    from bio_megatron.config.finetune import FinetuneModelConfig


def read_hf_state(path: str | Path, shape: ModelShape, padded_vocab: int, task: str | None = None) -> dict:
    """An HF folder's weights as a full (TP1) megatron-core state, head included for task folders; its family's
    ``from_hf`` renames them (``config.json``'s ``model_type`` names the family)."""
    from bio_megatron.config.pretrain import ModelConfig

    path = Path(path)
    hsd = read_hf_weights(path)
    hf_cfg = load_json(path / "config.json") if (path / "config.json").is_file() else {}
    check_config_tensors(hf_cfg, hsd, str(path))  # before any renaming: the message names the file's tensors
    family = family_of_hf(hf_cfg, f"{path}/config.json")
    m = ModelConfig(**family.shape_from_hf(hf_cfg, f"{path}/config.json"))
    m.num_layers, m.hidden_size = shape.num_layers, shape.hidden_size  # the model being filled decides
    m.num_attention_heads, m.ffn_hidden_size = shape.num_attention_heads, shape.ffn_hidden_size
    binary = "cls.seq_relationship.weight" in hsd
    try:
        full = family.from_hf(hsd, m, padded_vocab, binary_head=binary)
        if task is None:  # the folder's class names it (formats/source.py refused an unknown remote class)
            task = CLASS_TASK.get((hf_cfg.get("architectures") or [""])[0])
        if task is not None:
            full.update(hf_to_head(task, hsd, family))
    except KeyError as exc:
        raise CheckpointError(f"{path}: weight {exc.args[0]} is missing "
                              f"(not a {' / '.join(family.hf_model_types)} checkpoint?)") from None
    return full


def read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """An HF folder's state dict as saved (every ``*.safetensors``, or ``pytorch_model.bin``); one-line errors."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files and (path / "pytorch_model.bin").is_file():
        files = [path / "pytorch_model.bin"]
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors or pytorch_model.bin")
    hsd = {}
    for f in files:
        if f.suffix != ".safetensors":  # torch's zip format: records are checked before torch allocates them
            check_zip_if_zip(f, str(f), _weights_bound(path))
        try:
            part = load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu",
                                                                                   weights_only=True)
        except Exception as exc:  # safetensors' SafetensorError, torch's UnpicklingError/EOFError/RuntimeError
            raise CheckpointError(f"{f}: unreadable weights file, truncated or damaged? ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from None
        if not isinstance(part, dict) or not all(torch.is_tensor(v) for v in part.values()):
            raise CheckpointError(f"{f}: not a state dict of tensors")
        hsd.update(part)
    return hsd


def _weights_bound(path: Path) -> int | None:
    """Bytes the folder's ``config.json`` shape can take (fp64 at most), or None when it names no shape."""
    try:
        cfg = load_json(path / "config.json")
    except Exception:  # reported by whoever reads the config for the model itself
        return None
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "max_position_embeddings")
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k), int) and cfg[k] > 0 for k in keys):
        return None
    return shape_bound(cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"],
                       cfg["max_position_embeddings"], bytes_per_param=8)


# --- heads: which class holds which task's head, its settings and weights --------------------------------------
REMOTE_CLASS = {"ner": "BioMegatronForTokenClassification", "qa": "BioMegatronForQuestionAnswering",
                "re": "BioMegatronForSequenceClassification"}
# Every family's plain task classes (its own head names: ``Family.head_from_hf``) and the remote-code ones. RE and
# BLURB classification share the sequence classifier, which reads back as RE's head.
CLASS_TASK = {**{f.hf_class(t): t for f in FAMILIES.values() for t in ("ner", "qa", "re")},
              **{c: t for t, c in REMOTE_CLASS.items()}}
HEAD_KEYS = ("num_fc_layers", "fc_hidden_size", "activation", "fc_dropout")
_ACTIVATIONS = ("relu", "gelu", "tanh")


def head_block(task: str) -> tuple[str, str]:
    """The config block holding the head and its layer-count key (RE and classify keep NeMo's SequenceClassifier
    names)."""
    return ("classifier_head", "num_output_layers") if task in ("re", "classify") else ("head", "num_fc_layers")


def hf_to_head(task: str, hsd: dict, family: Family) -> dict:
    """The ``head.*`` weights of an HF state dict, from either kind of class (KeyError names a missing weight)."""
    # the remote-code classes keep NeMo's MLP (``head.mlp.*``); a plain class's own ``head.*`` (ModernBERT's
    # prediction head) is the family's to map
    ours = {k: v for k, v in hsd.items() if k.startswith("head.mlp.")}
    return ours or family.head_from_hf(task, hsd)


def validate_head(settings: object, where: str) -> dict:
    """``bio_megatron_head`` from a config.json, checked (CheckpointError quoting the bad values)."""
    if not isinstance(settings, dict):
        raise CheckpointError(f"{where}: bio_megatron_head must be an object with {list(HEAD_KEYS)}, got {settings!r}")
    problems = [f"missing {k}" for k in HEAD_KEYS if k not in settings]
    problems += [f"unknown key {k}" for k in settings if k not in HEAD_KEYS]
    n, width, act = settings.get("num_fc_layers"), settings.get("fc_hidden_size"), settings.get("activation")
    if "num_fc_layers" in settings and not (isinstance(n, int) and n >= 1):
        problems.append(f"num_fc_layers ({n!r}) must be an integer >= 1")
    if "fc_hidden_size" in settings and not (width is None or (isinstance(width, int) and width >= 1)):
        problems.append(f"fc_hidden_size ({width!r}) must be null or an integer >= 1")
    drop = settings.get("fc_dropout")
    if "fc_dropout" in settings and not (isinstance(drop, (int, float)) and 0 <= drop < 1):
        problems.append(f"fc_dropout ({drop!r}) must be a number in [0, 1)")
    if "activation" in settings and act not in _ACTIVATIONS:
        problems.append(f"activation ({act!r}) must be one of {list(_ACTIVATIONS)}")
    if problems:
        raise CheckpointError(f"{where}: bio_megatron_head {settings}: " + "; ".join(problems))
    return dict(settings)


def plain_head(task: str) -> dict:
    """The head every family's plain ``*For{TokenClassification,QuestionAnswering}`` (one Linear) and
    ``*ForSequenceClassification`` (tanh pooler as wide as the encoder + Linear) computes, as ``Source.head``."""
    block, count = head_block(task)
    plain = {count: 2, "activation": "tanh"} if task in ("re", "classify") else {count: 1}
    return {block: plain, "fc_hidden_size": None}


def source_head(arch: str, hf_cfg: dict, where: str) -> dict:
    """The head of an HF task folder (class ``arch``) in a checkpoint's ``config.yaml`` terms (``Source.head``)."""
    task = CLASS_TASK[arch]
    if arch not in REMOTE_CLASS.values():  # a family's plain class: exactly the head it computes
        return plain_head(task)
    block, count = head_block(task)
    if "bio_megatron_head" not in hf_cfg:
        raise CheckpointError(f"{where}: {arch} needs bio_megatron_head ({list(HEAD_KEYS)}) in config.json")
    s = validate_head(hf_cfg["bio_megatron_head"], where)
    return {block: {count: s["num_fc_layers"], "activation": s["activation"], "fc_dropout": s["fc_dropout"]},
            "fc_hidden_size": s["fc_hidden_size"]}


def apply_head(model_cfg: FinetuneModelConfig, saved: dict) -> None:
    """Set a task model config's head from ``Source.head`` (``fc_hidden_size`` and the head block's keys)."""
    for block in ("head", "classifier_head"):
        for k, v in (saved.get(block) or {}).items():
            setattr(getattr(model_cfg, block), k, v)
    if "fc_hidden_size" in saved:
        model_cfg.fc_hidden_size = saved["fc_hidden_size"]
