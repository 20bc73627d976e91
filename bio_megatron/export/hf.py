"""``export hf`` / ``import hf``: BioMegatron checkpoints <-> Hugging Face ``MegatronBert*`` folders.

Export loads the checkpoint (saved at any TP/PP layout) into one TP1 process through dist-checkpointing
resharding, converts the encoder with :mod:`bio_megatron.models.hf_convert` and maps the head:

=========  ======================================  =============================================
task       HF class                                head that maps exactly
=========  ======================================  =============================================
(none)     MegatronBertForMaskedLM / ForPreTraining  the LM head (+ NSP head when trained with it)
ner        MegatronBertForTokenClassification      ``head.num_fc_layers: 1`` -> ``classifier``
qa         MegatronBertForQuestionAnswering        ``head.num_fc_layers: 1`` -> ``qa_outputs``
re         MegatronBertForSequenceClassification   ``classifier_head.num_output_layers: 2`` with
                                                    ``activation: tanh`` and ``fc_hidden_size`` =
                                                    encoder width -> ``bert.pooler`` + ``classifier``
=========  ======================================  =============================================

HF's heads are fixed shapes; any other NeMo MLP head cannot be expressed and export fails naming the
setting. The folder gets ``model.safetensors``, ``config.json`` (``id2label``/``label2id``),
``vocab.txt`` + tokenizer files, and ``label_ids.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from bio_megatron.config.sizes import ModelShape
from bio_megatron.models.hf_convert import hf_config, hf_to_mcore, mcore_to_hf
from bio_megatron.tasks.model import Source, resolve_source
from bio_megatron.utils.errors import CheckpointError, ConfigError
from bio_megatron.utils.io import atomic_path
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
HF_CLASS = {None: "MegatronBertForMaskedLM", "ner": "MegatronBertForTokenClassification",
            "re": "MegatronBertForSequenceClassification", "qa": "MegatronBertForQuestionAnswering"}


def check_exportable(task: str, model_cfg) -> None:
    """Raise ConfigError naming the setting when the head has no ``MegatronBertFor*`` equivalent."""
    hidden = model_cfg.shape().hidden_size
    if task in ("ner", "qa") and model_cfg.head.num_fc_layers != 1:
        raise ConfigError(f"model.head.num_fc_layers={model_cfg.head.num_fc_layers}: {HF_CLASS[task]} has a single "
                          "linear classifier, so only num_fc_layers=1 can be exported; fine-tune with "
                          "model.head.num_fc_layers=1 to get an exportable model")
    if task == "re":
        h = model_cfg.classifier_head
        if h.num_output_layers != 2 or h.activation != "tanh" or model_cfg.fc_hidden_size not in (None, hidden):
            raise ConfigError(
                f"model.classifier_head (num_output_layers={h.num_output_layers}, activation={h.activation}, "
                f"model.fc_hidden_size={model_cfg.fc_hidden_size}): MegatronBertForSequenceClassification is a "
                f"tanh pooler ({hidden}x{hidden}) + linear classifier, so only num_output_layers=2, activation=tanh, "
                "fc_hidden_size=null can be exported")


def _head_to_hf(task: str, sd: dict) -> dict:
    g = lambda k: sd[k].detach().clone().contiguous()  # noqa: E731
    if task == "ner":
        return {"classifier.weight": g("head.mlp.layer0.weight"), "classifier.bias": g("head.mlp.layer0.bias")}
    if task == "qa":
        return {"qa_outputs.weight": g("head.mlp.layer0.weight"), "qa_outputs.bias": g("head.mlp.layer0.bias")}
    return {"bert.pooler.dense.weight": g("head.mlp.layer0.weight"), "bert.pooler.dense.bias": g("head.mlp.layer0.bias"),
            "classifier.weight": g("head.mlp.layer2.weight"), "classifier.bias": g("head.mlp.layer2.bias")}


def _hf_to_head(task: str, hsd: dict) -> dict:
    pairs = {"ner": {"classifier": "head.mlp.layer0"}, "qa": {"qa_outputs": "head.mlp.layer0"},
             "re": {"bert.pooler.dense": "head.mlp.layer0", "classifier": "head.mlp.layer2"}}[task]
    return {f"{ours}.{p}": hsd[f"{theirs}.{p}"] for theirs, ours in pairs.items() for p in ("weight", "bias")}


def _save_tokenizer(out: Path, vocab_file: Path, lowercase: bool) -> None:
    from transformers import BertTokenizer

    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    # transformers 5.x ignores BertTokenizer(vocab_file=...): pass the vocabulary itself.
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=lowercase)
    tok.save_pretrained(str(out))
    # transformers 5 writes only tokenizer.json; keep the plain WordPiece vocab.txt too (what import reads).
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")


def export_hf(checkpoint: str | Path, out: str | Path) -> dict:
    """Write an HF folder for ``checkpoint`` (pretraining or fine-tuned, any saved layout); returns a summary."""
    from bio_megatron.predict.common import load_finetuned, single_process

    single_process()
    src = resolve_source(checkpoint)
    if src.kind != "checkpoint":
        raise CheckpointError(f"{checkpoint}: already a Hugging Face folder")
    if src.task is None:
        hsd, config, tok_lower, labels = _pretraining_to_hf(src)
    else:
        cfg_model = _saved_model_cfg(src)
        check_exportable(src.task, cfg_model)
        loaded = load_finetuned(checkpoint)
        sd = loaded.model.state_dict()
        shape, vocab = loaded.model.shape, loaded.tokenizer.vocab_size
        hsd = {**mcore_to_hf(sd, shape, vocab, binary_head=False), **_head_to_hf(src.task, sd)}
        labels = loaded.labels
        extra = {"architectures": [HF_CLASS[src.task]]}
        if labels:
            extra.update(num_labels=len(labels), id2label={i: t for i, t in enumerate(labels)},
                         label2id={t: i for i, t in enumerate(labels)})
        m = loaded.cfg.model
        config = hf_config(shape, vocab, m.max_position_embeddings, m.num_tokentypes, m.layernorm_epsilon, **extra)
        tok_lower = loaded.tokenizer.lowercase
    import transformers

    hf_model = getattr(transformers, config.architectures[0])(config)
    missing, unexpected = hf_model.load_state_dict(hsd, strict=False)
    missing = [k for k in missing if "position_ids" not in k and k != "cls.predictions.decoder.weight"]
    if missing or unexpected:
        raise CheckpointError(f"conversion incomplete for {config.architectures[0]}: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    with atomic_path(out) as tmp:
        hf_model.save_pretrained(str(tmp), safe_serialization=True)
        _save_tokenizer(tmp, src.vocab_file, tok_lower)
        if labels:
            (tmp / "label_ids.csv").write_text("\n".join(labels) + "\n", encoding="utf-8")
        (tmp / "bio_megatron_export.json").write_text(json.dumps(
            {"source": str(src.path), "task": src.task, "class": config.architectures[0]}, indent=2) + "\n")
    log.info("exported %s -> %s (%s)", src.path, out, config.architectures[0])
    return {"out": str(out), "class": config.architectures[0], "task": src.task, "labels": labels}


def _saved_model_cfg(src: Source):
    from bio_megatron.predict.common import task_config_of

    m = task_config_of(src).model
    for k, v in src.shape.items():
        setattr(m, k, v)
    return m


def _pretraining_to_hf(src: Source):
    """MLM (+NSP) model of a pretraining checkpoint at TP1, converted."""
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.models.bert import build_model
    from bio_megatron.training.checkpoint import load_checkpoint
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    raw = (yaml.safe_load((src.path / "config.yaml").read_text()) or {}).get("model", {})
    binary = bool(raw.get("bert_binary_head", False))
    tok = WordPieceTokenizer(src.vocab_file, (raw.get("tokenizer") or {}).get("do_lower_case"))
    m = ModelConfig(**{k: v for k, v in src.shape.items()}, bert_binary_head=binary, hidden_dropout=0.0,
                    attention_dropout=0.0, transformer_impl="local")
    if src.padded_vocab:  # rebuild the embedding exactly as saved (its padding depends on the saved TP size)
        m.make_vocab_size_divisible_by = int(src.padded_vocab)
    model = build_model(m, tok.vocab_size, torch.float32, pre_process=True, post_process=True)
    load_checkpoint(src.path, model, model_only=True)
    sd = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
    shape = m.shape()
    hsd = mcore_to_hf(sd, shape, tok.vocab_size, binary_head=binary)
    arch = "MegatronBertForPreTraining" if binary else "MegatronBertForMaskedLM"
    config = hf_config(shape, tok.vocab_size, m.max_position_embeddings, m.num_tokentypes, m.layernorm_epsilon,
                       architectures=[arch])
    return hsd, config, tok.lowercase, None


def read_hf_state(path: str | Path, shape: ModelShape, padded_vocab: int, task: str | None = None) -> dict:
    """An HF folder's weights as a full (TP1) megatron-core state, head included for task folders."""
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if files:
        hsd = {k: v for f in files for k, v in load_file(str(f)).items()}
    elif (path / "pytorch_model.bin").is_file():
        hsd = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{path}: no *.safetensors or pytorch_model.bin")
    prefix = "bert." if any(k.startswith("bert.") for k in hsd) else ""
    binary = "cls.seq_relationship.weight" in hsd
    try:
        full = hf_to_mcore(hsd, shape, padded_vocab, binary_head=binary, prefix=prefix)
        if task is None:
            task = resolve_source(path).task
        if task is not None:
            full.update(_hf_to_head(task, hsd))
    except KeyError as exc:
        raise CheckpointError(f"{path}: weight {exc.args[0]} is missing (not a MegatronBert checkpoint?)") from None
    return full


def task_config_for_hf(src: Source):
    """A task config whose head matches the HF class exactly (what ``finetune``/``predict`` build for it)."""
    from bio_megatron.config.finetune import CONFIG_CLASSES

    cfg = CONFIG_CLASSES[src.task]()
    if src.task == "re":
        h = cfg.model.classifier_head
        h.num_output_layers, h.activation, cfg.model.fc_hidden_size = 2, "tanh", None
    else:
        cfg.model.head.num_fc_layers, cfg.model.fc_hidden_size = 1, None
    cfg.model.transformer_impl = "local"
    return cfg


def import_hf(hf_dir: str | Path, out: str | Path) -> dict:
    """Write a BioMegatron checkpoint (TP1, model weights only; loadable at any layout) from an HF folder."""
    from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.models.bert import build_model
    from bio_megatron.predict.common import single_process
    from bio_megatron.tasks.heads import build_head
    from bio_megatron.tasks.model import build_task_model, load_full_state
    from bio_megatron.training import checkpoint as ckpt
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    single_process()
    src = resolve_source(hf_dir)
    if src.kind != "hf":
        raise CheckpointError(f"{hf_dir}: not a Hugging Face folder (no config.json)")
    if src.vocab_file is None:
        raise CheckpointError(f"{hf_dir}: no vocab.txt; a WordPiece vocabulary is needed beside the weights")
    tok = WordPieceTokenizer(src.vocab_file)
    if src.task is None:
        cfg = PretrainConfig(model=ModelConfig(**src.shape, transformer_impl="local"))
        m = cfg.model
        padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 1)
        full = read_hf_state(hf_dir, m.shape(), padded)
        m.bert_binary_head = "binary_head.weight" in full
        model = build_model(m, tok.vocab_size, torch.float32, pre_process=True, post_process=True)
    else:
        cfg = task_config_for_hf(src)
        m = cfg.model
        for k, v in src.shape.items():
            setattr(m, k, v)
        padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 1)
        head = build_head(src.task, m, m.shape().hidden_size, len(src.labels) if src.labels else 2)
        model = build_task_model(m, padded, head, torch.float32, seed=0, pre_process=True, post_process=True)
        full = read_hf_state(hf_dir, m.shape(), padded, src.task)
    m.tokenizer.vocab_file, m.tokenizer.do_lower_case = "vocab.txt", tok.lowercase
    load_full_state(model, full)
    ckpt.save_model_checkpoint(
        out, model, cfg, src.vocab_file,
        {"imported_from": str(hf_dir), "layout": {"tp": 1, "pp": 1, "dp": 1, "distributed_optimizer": False},
         "task": src.task, "vocab_size": tok.vocab_size, "padded_vocab_size": padded, "labels": src.labels},
        files={"label_ids.csv": "\n".join(src.labels) + "\n"} if src.labels else None)
    log.info("imported %s -> %s (task %s)", hf_dir, out, src.task or "pretraining")
    return {"out": str(out), "task": src.task, "labels": src.labels}
