"""A Hugging Face folder's weights and task config in our terms: what ``finetune`` / ``predict`` / ``import hf``
load from an HF folder (``MegatronBert*`` / ``Bert*``, RoBERTa, an ELECTRA discriminator, or the remote-code
``BioMegatronFor*`` classes of :mod:`bio_megatron.export.hf_modeling`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.families import family_of_hf
from bio_megatron.loading.archives import check_zip_if_zip, shape_bound
from bio_megatron.loading.hf_heads import apply_head, hf_to_head, plain_head
from bio_megatron.loading.source import Source, resolve_source
from bio_megatron.models.hf_convert import check_config_tensors
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import load_json


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
        if task is None:
            task = resolve_source(path).task
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


def task_config_for_hf(src: Source):
    """A task config whose head is the HF folder's (``Source.head``: the plain class's fixed head, or the
    ``bio_megatron_head`` of a remote-code folder); what ``finetune``/``predict``/``import hf`` build for it."""
    from bio_megatron.config.finetune import CONFIG_CLASSES

    cfg = CONFIG_CLASSES[src.task]()
    apply_head(cfg.model, src.head or plain_head(src.task))
    cfg.model.transformer_impl = "local"
    cfg.model.tokenizer.do_lower_case = src.lowercase  # None (no tokenizer settings): guessed from the vocabulary
    return cfg
