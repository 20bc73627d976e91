"""Encoder + task head on megatron-core, at any TP/PP layout, and every way to fill its weights.

:class:`TaskModel` holds exactly the parameter names of megatron-core's ``BertModel`` encoder
(``embedding.*``, ``encoder.layers.*``, ``encoder.final_layernorm.*``) plus ``head.*`` on the last
pipeline stage, so a pretraining checkpoint's shards load into it directly (at any layout, through
dist-checkpointing) and a fine-tuned checkpoint round-trips. The head is a plain ``nn.Module``:
megatron treats it as replicated across tensor-parallel ranks (identical inputs, identical grads, counted
once in the gradient norm).

Sources (``model.restore_from_path``): a BioMegatron pretraining or fine-tuning checkpoint (directory,
``checkpoints`` folder or run directory) or a Hugging Face folder: ``MegatronBert*`` or the remote-code
``BioMegatronFor*`` classes that ``export hf`` writes for other heads (:mod:`bio_megatron.export.hf_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import TransformerBlock
from torch import nn

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.export.hf_heads import CLASS_TASK, REMOTE_MODEL_TYPE, source_head
from bio_megatron.models.bert import layer_spec, transformer_config
from bio_megatron.models.hf_convert import _TE_ALIASES, HF_MODEL_TYPES, hf_shape
from bio_megatron.models.init import init_weights
from bio_megatron.models.post_ln import add_embedding_layernorm, is_post_ln
from bio_megatron.tasks.heads import pytorch_default_init
from bio_megatron.training.checkpoint import from_main_params, load_sharded, read_metadata
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import load_json
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_SHAPE_KEYS = ("size", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
               "max_position_embeddings", "num_tokentypes", "layernorm_epsilon", "make_vocab_size_divisible_by",
               "transformer_block_type")


class TaskModel(MegatronModule):
    """This rank's stage of BERT encoder + head; returns hidden states between stages, head logits at the end."""

    def __init__(self, m: ModelConfig, padded_vocab: int, head: nn.Module | None, dtype: torch.dtype,
                 pre_process: bool, post_process: bool):
        super().__init__(config=transformer_config(m, dtype))
        self.pre_process, self.post_process = pre_process, post_process
        self.model_type = ModelType.encoder_or_decoder  # what megatron's schedules expect of BERT
        self.shape, self.padded_vocab = m.shape(), padded_vocab
        self.share_embeddings_and_output_weights = False  # no LM output layer: nothing tied across stages
        spec = layer_spec(m)
        core = spec.submodules.self_attention.submodules.core_attention
        # megatron's unfused attention wants [b,1,s,s]; SDPA/Transformer Engine a key-padding mask [b,1,1,s].
        self.mask_dims = "b1ss" if core is DotProductAttention else "b11s"
        post_ln = is_post_ln(spec)
        if pre_process:
            self.embedding = LanguageModelEmbedding(config=self.config, vocab_size=padded_vocab,
                                                    max_sequence_length=m.max_position_embeddings,
                                                    position_embedding_type="learned_absolute",
                                                    num_tokentypes=m.num_tokentypes)
            if post_ln:  # original BERT: LayerNorm on the embedding sum, none after the last layer
                add_embedding_layernorm(self.embedding)
        self.encoder = TransformerBlock(config=self.config, spec=spec, pre_process=pre_process,
                                        post_process=post_process, post_layer_norm=not post_ln)
        if post_process:
            self.head = head

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self.encoder.set_input_tensor(input_tensor)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                tokentype_ids: torch.Tensor | None = None) -> torch.Tensor:
        mask = attention_mask.unsqueeze(1)
        mask = (mask.unsqueeze(2) * mask.unsqueeze(3)) if self.mask_dims == "b1ss" else mask.unsqueeze(1)
        hidden = None
        if self.pre_process:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
            hidden = self.embedding(input_ids=input_ids, position_ids=positions, tokentype_ids=tokentype_ids)
        hidden = self.encoder(hidden_states=hidden, attention_mask=mask < 0.5)
        if not self.post_process:
            return hidden
        return self.head(hidden.transpose(0, 1))  # [s, b, h] -> [b, s, h]


# --- sources -------------------------------------------------------------------------------------
@dataclass
class Source:
    """What ``restore_from_path`` points at, with the encoder shape and files it brings."""

    kind: str                      # "checkpoint" | "hf"
    path: Path
    shape: dict = field(default_factory=dict)   # ModelConfig fields to take over
    vocab_file: Path | None = None
    labels: list[str] | None = None
    task: str | None = None        # None = pretraining checkpoint / base HF model
    padded_vocab: int | None = None
    head: dict | None = None       # model.head / classifier_head / fc_hidden_size (fine-tuned checkpoint, HF folder)
    lowercase: bool | None = None  # the HF folder's tokenizer (None: the checkpoint's config says it)
    origin: Path | None = None     # the .nemo / Megatron-LM source that ``path`` was converted from


_HF_INT_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")


def _read_hf_config(file: Path) -> dict:
    """An HF ``config.json``, checked for what the conversion reads: broken JSON is a DataError naming the
    file and line; a missing or mistyped shape key or label map a CheckpointError naming the key."""
    cfg = load_json(file)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: a JSON object is expected, not {type(cfg).__name__}")
    for key in _HF_INT_KEYS:
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            what = "missing" if key not in cfg else f"{value!r}"
            raise CheckpointError(f"{file}: {key} {what}, a positive integer is expected")
    eps = cfg.get("layer_norm_eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise CheckpointError(f"{file}: layer_norm_eps {eps!r}, a positive number is expected")
    id2label = cfg.get("id2label")
    if id2label and (not isinstance(id2label, dict) or set(id2label) != {str(i) for i in range(len(id2label))}):
        got = sorted(id2label)[:5] if isinstance(id2label, dict) else id2label
        raise CheckpointError(f"{file}: id2label {got!r}, a map from \"0\", \"1\", ... (every label id) to "
                              f"label names is expected")
    return cfg


def resolve_source(path: str | Path) -> Source:
    """Inspect a checkpoint, HF folder, ``.nemo`` archive or Megatron-LM checkpoint (the last two are imported
    once into a cached checkpoint of ours: :mod:`bio_megatron.interchange.sources`). Raises CheckpointError
    naming the path when it is none of them."""
    from bio_megatron.interchange.sources import foreign_kind, imported

    path = Path(path)
    kind = foreign_kind(path)
    if kind is not None:
        src = resolve_source(imported(path, kind))
        src.origin = path
        return src
    if (path / "config.json").is_file() and not (path / "bio_megatron.json").is_file():
        return _resolve_hf(path)
    meta = read_metadata(path)
    ckpt = Path(meta["path"])
    cfg = yaml.safe_load((ckpt / "config.yaml").read_text()) or {}
    model = cfg.get("model", {})
    shape = {k: model[k] for k in _SHAPE_KEYS if model.get(k) is not None}
    labels = None
    if (ckpt / "label_ids.csv").is_file():
        labels = (ckpt / "label_ids.csv").read_text(encoding="utf-8").splitlines()
    head = None
    if meta.get("task"):
        head = {k: model[k] for k in ("head", "classifier_head", "fc_hidden_size") if k in model}
    vocab = ckpt / "vocab.json" if (ckpt / "vocab.json").is_file() else ckpt / "vocab.txt"  # BPE / WordPiece
    return Source("checkpoint", ckpt, shape, vocab, labels, meta.get("task"),
                  meta.get("padded_vocab_size"), head)


def _resolve_hf(path: Path) -> Source:
    cfg = _read_hf_config(path / "config.json")
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        raise CheckpointError(f"{path}/config.json: model_type {cfg.get('model_type')!r}, expected one of "
                              f"{sorted(HF_MODEL_TYPES)}")
    shape = hf_shape(cfg, f"{path}/config.json")
    arch = (cfg.get("architectures") or [""])[0]
    task = CLASS_TASK.get(arch)
    if task is None and cfg["model_type"] == REMOTE_MODEL_TYPE:
        raise CheckpointError(f"{path}/config.json: architectures {cfg.get('architectures')!r}, expected one of "
                              f"{sorted(c for c in CLASS_TASK if c.startswith('BioMegatron'))}")
    labels = None
    if task in ("ner", "re") and cfg.get("id2label"):
        labels = [cfg["id2label"][str(i)] for i in range(len(cfg["id2label"]))]
    head = source_head(arch, cfg, f"{path}/config.json") if task else None
    vocab, lower = _hf_vocab(path)
    if vocab is not None and vocab.suffix == ".txt":
        entries = sum(1 for _ in vocab.open(encoding="utf-8"))
        if entries > cfg.get("vocab_size", entries):  # token ids past the embedding would read zero rows
            raise CheckpointError(f"{path}: the tokenizer has {entries} entries but config.json vocab_size is "
                                  f"{cfg['vocab_size']}: not this model's vocabulary")
    return Source("hf", path, shape, vocab, labels, task, head=head, lowercase=lower)


def _hf_vocab(path: Path) -> tuple[Path | None, bool | None]:
    """The WordPiece vocabulary and lower-casing of an HF folder: ``vocab.txt`` (transformers 4) or only
    ``tokenizer.json`` (transformers 5: ``model.vocab`` and the normalizer's ``lowercase``)."""
    from bio_megatron.interchange.sources import cached_vocab
    from bio_megatron.models.hf_convert import read_tokenizer_json

    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():  # RoBERTa's byte-level BPE
        return path / "vocab.json", False
    lower = None
    if (path / "tokenizer.json").is_file():
        tokens, lower = read_tokenizer_json(path / "tokenizer.json")
        if not (path / "vocab.txt").is_file():
            return cached_vocab(tokens), lower
    elif (path / "tokenizer_config.json").is_file():
        value = load_json(path / "tokenizer_config.json").get("do_lower_case")
        lower = value if isinstance(value, bool) else None
    return (path / "vocab.txt" if (path / "vocab.txt").is_file() else None), lower


def apply_source_shape(m: ModelConfig, src: Source) -> None:
    """The encoder shape comes from the weights being loaded, not from the recipe (a RoBERTa source's one token
    type and post-LN blocks too; its byte-level BPE vocabulary is loaded by ``load_tokenizer``)."""
    for k, v in src.shape.items():
        setattr(m, k, v)
    if src.lowercase is not None and m.tokenizer.do_lower_case is None:  # the HF folder's tokenizer setting
        m.tokenizer.do_lower_case = src.lowercase


def task_padded_vocab(m: ModelConfig, vocab_size: int, src: Source | None) -> int:
    """Keep the checkpoint's padded vocabulary when this TP size divides it (dist-checkpointing then loads
    the embedding shards unchanged); otherwise Megatron's rule (multiple of 128 x TP)."""
    tp = m.tensor_model_parallel_size
    if src is not None and src.padded_vocab and src.padded_vocab % tp == 0 and src.padded_vocab >= vocab_size:
        return int(src.padded_vocab)
    return padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp)


def build_task_model(m: ModelConfig, padded_vocab: int, head: nn.Module, dtype: torch.dtype, seed: int,
                     pre_process: bool | None = None, post_process: bool | None = None) -> TaskModel:
    """This rank's stage, weights initialised layout-invariantly (encoder and head)."""
    pre = ps.is_pipeline_first_stage() if pre_process is None else pre_process
    post = ps.is_pipeline_last_stage() if post_process is None else post_process
    model = TaskModel(m, padded_vocab, head if post else None, dtype, pre, post)
    init_weights(model, seed, m.init_method_std, m.shape().num_layers)
    if post and not getattr(head, "use_transformer_init", True):
        pytorch_default_init(model.head, "head.", seed)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    if dtype != torch.float32:
        model.to(dtype)
    return model


def load_into(model: nn.Module, src: Source, encoder_only: bool) -> None:
    """Fill ``model`` from ``src``; ``encoder_only`` keeps the (fresh) head, e.g. from a pretraining checkpoint."""
    if src.kind == "hf":
        from bio_megatron.export.hf import read_hf_state

        full = read_hf_state(src.path, model.shape, model.padded_vocab)
        load_full_state(model, full, skip_prefix="head." if encoder_only else None)
        return
    sharded = model.sharded_state_dict()
    wanted = {k: v for k, v in sharded.items() if not (encoder_only and k.startswith("head."))}
    from_main_params(wanted, src.path)  # an fp32 model from a bf16/fp16 run takes its fp32 main parameters
    state = load_sharded(src.path, {"model": wanted})["model"]  # verified, pickle allow-lists, one-line errors
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (encoder_only and k.startswith("head.")) and not k.endswith("_extra_state")]
    if missing or unexpected:
        raise CheckpointError(f"{src.path}: weights do not match the model (missing {missing[:5]}, "
                              f"unexpected {list(unexpected)[:5]})")


@torch.no_grad()
def load_full_state(model: nn.Module, full: dict[str, torch.Tensor], skip_prefix: str | None = None) -> None:
    """Copy an unsharded (TP1, per-layer) state dict into this rank's shards, using the same global
    key/slice bookkeeping as the layout-invariant init: works at any TP/PP layout."""
    for key, sh in model.sharded_state_dict().items():
        if not isinstance(sh, ShardedTensor) or (skip_prefix and key.startswith(skip_prefix)):
            continue
        if sh.key in full:
            value = full[sh.key]
        elif sh.key.startswith("encoder.layers."):
            rest = sh.key[len("encoder.layers."):]
            # the local spec checkpoints its LayerNorms under Transformer Engine's fused names
            rest = _TE_ALIASES.get(rest, rest) if f"encoder.layers.0.{rest}" not in full else rest
            value = torch.stack([full[f"encoder.layers.{i}.{rest}"] for i in range(sh.global_shape[0])])
        else:
            raise CheckpointError(f"weight {sh.key} is missing from the source")
        if tuple(value.shape) != tuple(sh.global_shape):  # vocabulary padding differs: zero-pad the rows
            if value.shape[1:] != tuple(sh.global_shape[1:]) or value.shape[0] > sh.global_shape[0]:
                raise CheckpointError(f"weight {sh.key} has shape {tuple(value.shape)} in the source but "
                                      f"{tuple(sh.global_shape)} in this model (different head or model size?)")
            pad = torch.zeros(sh.global_shape, dtype=value.dtype)
            pad[: value.shape[0]] = value
            value = pad
        sh.data.copy_(value[sh.global_slice()].reshape(sh.local_shape).to(sh.data.dtype))
