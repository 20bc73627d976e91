"""Where a model comes from: what ``model.restore_from_path`` / ``--checkpoint`` points at, inspected.

:func:`resolve_source` reads a BioMegatron pretraining or fine-tuning checkpoint (directory, ``checkpoints``
folder or run directory), a Hugging Face folder (``MegatronBert*`` / ``Bert*`` / RoBERTa / ELECTRA, or the
remote-code ``BioMegatronFor*`` classes that ``export hf`` writes for other heads: :mod:`.hf.read`), or a
``.nemo`` / Megatron-LM source (imported once: :mod:`.foreign`), and returns its :class:`Source`: the encoder
shape, vocabulary, labels, task and head it brings. No weights are read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import family_named, family_of_hf, family_of_model
from bio_megatron.families.megatron_bert import REMOTE_MODEL_TYPE
from bio_megatron.formats.detect import FOREIGN, detect
from bio_megatron.formats.saved import saved_model_config
from bio_megatron.formats.foreign import cached_vocab, imported
from bio_megatron.formats.hf.read import CLASS_TASK, apply_head, plain_head, source_head
from bio_megatron.models.hf_convert import read_tokenizer_json
from bio_megatron.training.checkpoint_dir import read_metadata
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.io import load_json
from bio_megatron.vocab.tokenizer_json import is_bpe_tokenizer_json


@dataclass
class Source:
    """What ``restore_from_path`` points at, with the encoder shape and files it brings."""

    kind: str                      # "checkpoint" | "hf"
    path: Path
    shape: dict = field(default_factory=dict)   # ModelConfig fields to take over, ``family`` always among them
    vocab_file: Path | None = None
    labels: list[str] | None = None
    task: str | None = None        # None = pretraining checkpoint / base HF model
    padded_vocab: int | None = None
    head: dict | None = None       # model.head / classifier_head / fc_hidden_size (fine-tuned checkpoint, HF folder)
    lowercase: bool | None = None  # the HF folder's tokenizer (None: the checkpoint's config says it)
    origin: Path | None = None     # the .nemo / Megatron-LM source that ``path`` was converted from


_HF_INT_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")
_NO_TOKEN_TYPES = ("modernbert",)


def read_hf_config(file: Path) -> dict:
    """An HF ``config.json``, checked for what the conversion reads: broken JSON is a DataError naming the
    file and line; a missing or mistyped shape key or label map a CheckpointError naming the key."""
    cfg = load_json(file)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: a JSON object is expected, not {type(cfg).__name__}")
    for key in _HF_INT_KEYS:
        if key == "type_vocab_size" and cfg.get("model_type") in _NO_TOKEN_TYPES:
            continue  # ModernBERT has no token-type table
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
    once into a cached checkpoint of ours: :mod:`bio_megatron.formats.foreign`). Raises CheckpointError
    naming the path when it is none of them."""
    path = Path(path)
    kind = detect(path)
    if kind in FOREIGN:
        src = resolve_source(imported(path, kind))
        src.origin = path
        return src
    if kind == "hf":
        return _resolve_hf(path)
    meta = read_metadata(path)
    ckpt = Path(meta["path"])
    model = saved_model_config(ckpt)
    vocab = ckpt / "vocab.json" if (ckpt / "vocab.json").is_file() else ckpt / "vocab.txt"  # BPE / WordPiece
    if (ckpt / "spiece.model").is_file():  # ALBERT's SentencePiece model (training/checkpoint.py saves it so)
        vocab = ckpt / "spiece.model"
    if not vocab.is_file() and is_bpe_tokenizer_json(ckpt / "tokenizer.json"):  # a one-file BPE (ModernBERT's)
        vocab = ckpt / "tokenizer.json"
    # recorded in config.yaml (bio_megatron.json too) since families exist; inferred for older checkpoints
    family = family_named(meta["family"]) if meta.get("family") else family_of_model(model, vocab_file=vocab)
    shape = {k: model[k] for k in family.shape_keys if model.get(k) is not None}  # the family's shape fields
    shape.update(_dimensions(model, family.shape_keys))
    shape["family"] = family.name
    labels = None
    if (ckpt / "label_ids.csv").is_file():
        labels = (ckpt / "label_ids.csv").read_text(encoding="utf-8").splitlines()
    head = None
    if meta.get("task"):
        head = {k: model[k] for k in ("head", "classifier_head", "fc_hidden_size") if k in model}
    return Source("checkpoint", ckpt, shape, vocab, labels, meta.get("task"),
                  meta.get("padded_vocab_size"), head)


_DIMENSIONS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")


def _dimensions(model: dict, keys: tuple[str, ...]) -> dict:
    """The four dimensions the saved model was built with, also those it took from its ``size`` (saved as null):
    given explicitly, so that a config naming its own dimensions cannot outrank the checkpoint's shape."""
    if model.get("size") is None:
        return {}
    built = ModelConfig(size=model["size"], **{k: model.get(k) for k in _DIMENSIONS}).shape()
    return {k: getattr(built, k) for k in _DIMENSIONS if k in keys}


def _resolve_hf(path: Path) -> Source:
    cfg = read_hf_config(path / "config.json")
    family = family_of_hf(cfg, f"{path}/config.json")
    shape = {**family.shape_from_hf(cfg, f"{path}/config.json"), "family": family.name}
    arch = (cfg.get("architectures") or [""])[0]
    task = CLASS_TASK.get(arch)
    if task is None and cfg["model_type"] == REMOTE_MODEL_TYPE:
        raise CheckpointError(f"{path}/config.json: architectures {cfg.get('architectures')!r}, expected one of "
                              f"{sorted(c for c in CLASS_TASK if c.startswith('BioMegatron'))}")
    labels = None
    if task in ("ner", "re") and cfg.get("id2label"):
        labels = [cfg["id2label"][str(i)] for i in range(len(cfg["id2label"]))]
    head = source_head(arch, cfg, f"{path}/config.json") if task else None
    if head is not None and hasattr(family, "hf_head_settings"):  # e.g. ModernBERT's classifier_dropout
        head = family.hf_head_settings(task, cfg, head)
    vocab, lower = _hf_vocab(path)
    if vocab is not None and vocab.suffix == ".txt":
        entries = sum(1 for _ in vocab.open(encoding="utf-8"))
        if entries > cfg.get("vocab_size", entries):  # token ids past the embedding would read zero rows
            raise CheckpointError(f"{path}: the tokenizer has {entries} entries but config.json vocab_size is "
                                  f"{cfg['vocab_size']}: not this model's vocabulary")
    if vocab is not None and vocab.name == "tokenizer.json":  # the same check for a one-file BPE (ModernBERT's)
        from bio_megatron.vocab.tokenizer_json import TokenizerJsonBPE

        entries = TokenizerJsonBPE(vocab).vocab_size
        if entries > cfg.get("vocab_size", entries):
            raise CheckpointError(f"{vocab}: {entries} tokens but {path}/config.json vocab_size is "
                                  f"{cfg['vocab_size']}: ids past the embedding have no row; not this model's "
                                  "vocabulary")
    return Source("hf", path, shape, vocab, labels, task, head=head, lowercase=lower)


def _hf_vocab(path: Path) -> tuple[Path | None, bool | None]:
    """The WordPiece vocabulary and lower-casing of an HF folder: ``vocab.txt`` (transformers 4) or only
    ``tokenizer.json`` (transformers 5: ``model.vocab`` and the normalizer's ``lowercase``)."""
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():  # RoBERTa's byte-level BPE
        return path / "vocab.json", False
    lower = None
    if (path / "spiece.model").is_file() and not (path / "vocab.txt").is_file():  # ALBERT's SentencePiece model
        if (path / "tokenizer_config.json").is_file():
            value = load_json(path / "tokenizer_config.json").get("do_lower_case")
            lower = value if isinstance(value, bool) else None
        return path / "spiece.model", lower
    if is_bpe_tokenizer_json(path):  # ModernBERT's one-file BPE (vocab/tokenizer_json.py), read as it is
        return path / "tokenizer.json", False
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


def task_config_for_hf(src: Source):
    """A task config whose head is the HF folder's (``Source.head``: the plain class's fixed head, or the
    ``bio_megatron_head`` of a remote-code folder); what ``finetune``/``predict``/``import hf`` build for it."""
    from bio_megatron.config.finetune import CONFIG_CLASSES

    cfg = CONFIG_CLASSES[src.task]()
    apply_head(cfg.model, src.head or plain_head(src.task))
    cfg.model.transformer_impl = "local"
    cfg.model.tokenizer.do_lower_case = src.lowercase  # None (no tokenizer settings): guessed from the vocabulary
    return cfg
