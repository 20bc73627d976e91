"""NeMo's config keys (releases 1.0 to 2.4), read as they are: renamed to ours, checked, or listed as having no effect.

A NeMo user brings ``megatron_bert_config.yaml``, ``token_classification_config.yaml``,
``text_classification_config.yaml``, ``qa_conf.yaml`` or (NeMo 1.0-1.12) ``question_answering_squad_config.yaml``
unmodified, from any release: NeMo 1.x files carry PyTorch Lightning 1.x trainer keys (``gpus``,
``max_steps: null``, ``accelerator: ddp``, ``resume_from_checkpoint`` ...), mapped in ``_lightning1`` or listed in
``nemo_keys.NO_EFFECT`` like the rest. ``translate`` rewrites the resolved
document (a plain dict) into this project's key names. Every NeMo key ends in exactly one of three places:

* mapped: renamed to our key with the same meaning (``model.seed`` -> ``trainer.seed``, ``train_ds`` ->
  ``model.dataset.*``, ``token_classifier.*`` -> ``model.head.*``, the tokenizer and encoder names ...);
* checked: the value must be the one behaviour this project has (``position_embedding_type:
  learned_absolute``); any other value is an error that lists the allowed values;
* no effect here: listed once, with the reason, in one warning (``model.onnx_safe``: no ONNX export).

Keys that are neither NeMo's nor ours stay in the document, so the dataclass builder still reports typos.
"""

from __future__ import annotations

import fnmatch
import posixpath
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bio_megatron.config.nemo_doc import NemoDoc
from bio_megatron.config.nemo_keys import CHECKED, KNOWN_MODELS, MEGATRON_TOKENIZERS, NO_EFFECT, RECOMPUTE_ALIASES
from bio_megatron.config.nemo_lightning import LIGHTNING1_KEYS, lightning1

MISSING = "???"

# NeMo registers this resolver (``${multiply:a,b}``, used by megatron_bert_config.yaml) at import time.
if not OmegaConf.has_resolver("multiply"):
    # omegaconf 2.4 renamed register_new_resolver (deprecated) to register_resolver.
    (OmegaConf.register_resolver if hasattr(OmegaConf, "register_resolver") else
     OmegaConf.register_new_resolver)("multiply", lambda x, y: x * y)

_DS_FILE_KEYS = {"ner": ("text_file",), "re": ("file_path",), "classify": ("file_path",), "qa": ("file",)}
_DS_TARGET = {"train_ds": "train_file", "validation_ds": "dev_file", "test_ds": "test_file"}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def unflatten(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            if node.get(p) is None:  # a null section (NeMo 1.x: ``tokenizer: null``) that a mapping fills
                node[p] = {}
            node = node[p]
        if not (v is None and isinstance(node.get(leaf), dict)):
            node[leaf] = v
    return out


def _reason(key: str, task: str) -> str | None:
    for pattern, tasks, reason in NO_EFFECT:
        if (tasks is None or task in tasks) and fnmatch.fnmatchcase(key, pattern):
            return reason
    return None


def translate(doc: dict, task: str, cli_keys: set[str] = frozenset(), world_size: int | None = None
              ) -> tuple[dict, list[str], dict[str, str]]:
    """Resolved document -> (our document, problems, {NeMo key: why it has no effect here}).

    ``task`` is ``pretrain``, ``ner``, ``re``, ``classify`` or ``qa``; ``cli_keys`` are the dotted keys given on the
    command line; ``world_size`` (when known) turns NeMo's per-GPU batch size into our global batch."""
    d = NemoDoc(flatten(doc), set(cli_keys))
    if task == "pretrain" and any(k.startswith(("model.train_ds.", "model.only_mlm_loss")) for k in d.flat):
        # One line instead of a dozen unknown keys: a different model and data format, not other key names.
        return {}, [_BERTLM_REFUSAL], {}
    for key in list(d.flat):  # our own keys pass through first, so a NeMo alias meets them in ``set``
        if not _is_nemo_key(key, task):
            d.set(key, d.flat.pop(key), key)
    _trainer(d, task)
    _exp_manager(d)
    _encoder(d, task)
    _tokenizer(d)
    if task != "pretrain":
        _datasets(d, task, world_size)
    for key in list(d.flat):
        value = d.flat.pop(key)
        if key in CHECKED:
            allowed, why = CHECKED[key]
            if value not in allowed:
                d.problems.append(f"{key} ({value!r}) must be {' or '.join(repr(a) for a in allowed)} here: {why}")
        elif (reason := _reason(key, task)) is not None:
            d.ignored[key] = reason
        else:
            d.set(key, value, key)
    d.problems += [f"{src} is mandatory ({MISSING} in the config): give it on the command line, {src}=VALUE"
                   for target, src in d.source.items() if d.out[target] == MISSING]
    return unflatten(d.out), d.problems, d.ignored


_BERTLM_REFUSAL = ("model.train_ds: this is NeMo 1.x's bert_pretraining_from_text/_preprocessed config (BERTLMModel, "
                   "a Hugging Face BERT trained on raw text or HDF5); pretraining here is Megatron BERT on indexed "
                   "data: start from NeMo's megatron_bert_config.yaml (1.6 and later) or this project's recipes, with "
                   "data from `bio-megatron data tokenize` in model.data.data_prefix")


def _is_nemo_key(key: str, task: str) -> bool:
    if key in CHECKED or _reason(key, task) is not None:
        return True
    if key == "model.tokenizer.do_lower_case":
        return False
    nemo_prefixes = ("model.seed", "model.tokenizer.", "model.language_model.", "model.token_classifier.",
                     "model.train_ds.", "model.validation_ds.", "model.test_ds.", "model.data.seq_length",
                     "trainer.devices", "trainer.val_check_interval", *LIGHTNING1_KEYS,
                     "trainer.accumulate_grad_batches", "exp_manager.explicit_log_dir", "exp_manager.exp_dir",
                     "restore_from_path")
    return key.startswith(nemo_prefixes) or key in RECOMPUTE_ALIASES


def _trainer(d: NemoDoc, task: str) -> None:
    lightning1(d, task)
    if "trainer.devices" in d.flat:
        v = d.pop("trainer.devices")
        # PTL: a list names GPU ids (the count is what matters: each rank's GPU is its LOCAL_RANK); -1 = all.
        d.set("trainer.devices", len(v) if isinstance(v, list) else ("auto" if v == -1 else v), "trainer.devices")
    if "trainer.val_check_interval" in d.flat:
        v = d.pop("trainer.val_check_interval")
        if task == "pretrain" and isinstance(v, float):
            if not v.is_integer():
                d.problems.append(f"trainer.val_check_interval ({v}): a fraction of an epoch has no meaning in "
                                  "step-based pretraining; give a step count")
                return
            v = int(v)
        d.set("trainer.val_check_interval", v, "trainer.val_check_interval")
    if "trainer.accumulate_grad_batches" in d.flat:
        v = d.pop("trainer.accumulate_grad_batches")
        if task == "pretrain" and v != 1:
            d.problems.append(f"trainer.accumulate_grad_batches ({v}) must be 1 for Megatron models: accumulation "
                              "follows from model.global_batch_size / (micro_batch_size x data-parallel size)")
        elif task != "pretrain":
            d.flat["__accumulate"] = v  # consumed by _datasets with train_ds.batch_size


def _exp_manager(d: NemoDoc) -> None:
    if d.flat.get("exp_manager.explicit_log_dir") is not None:
        # NeMo writes into explicit_log_dir itself; our run directory is exp_dir/name.
        path = str(d.pop("exp_manager.explicit_log_dir")).rstrip("/")
        d.set("exp_manager.exp_dir", posixpath.dirname(path) or ".", "exp_manager.explicit_log_dir")
        d.set("exp_manager.name", posixpath.basename(path), "exp_manager.explicit_log_dir")
    d.pop("exp_manager.explicit_log_dir")
    if "exp_manager.exp_dir" in d.flat:
        v = d.pop("exp_manager.exp_dir")
        if v is not None:  # null: NeMo's default directory; ours is runs/
            d.set("exp_manager.exp_dir", v, "exp_manager.exp_dir")
    for logger in ("wandb", "mlflow"):  # a disabled logger's kwargs are never read by NeMo (a ??? there included)
        if d.out.get(f"exp_manager.create_{logger}_logger") is not True:
            for key in [k for k in d.out if k.startswith(f"exp_manager.{logger}_logger_kwargs")]:
                del d.out[key]
                d.source.pop(key, None)


def _encoder(d: NemoDoc, task: str) -> None:
    for alias, ours in RECOMPUTE_ALIASES.items():
        if alias in d.flat:
            d.set(ours, d.pop(alias), alias)
    # NeMo 1.6-1.13 wrote activations_checkpoint_num_layers: 1 beside method null: no recompute, the count unused.
    layers = "model.activations_checkpoint_num_layers"
    src = d.source.get(layers)
    if (src is not None and not d.from_cli(src) and d.out[layers] is not None
            and d.out.get("model.activations_checkpoint_method") is None
            and d.out.get("model.activations_checkpoint_granularity") is None):
        del d.out[layers], d.source[layers]
        d.ignored[src] = ("recompute is off (activations_checkpoint_method and _granularity null): the layer count "
                          "is unused, as in NeMo")
    if "model.seed" in d.flat:
        d.set("trainer.seed", d.pop("model.seed"), "model.seed")
    if d.flat.get("restore_from_path") is not None:
        d.set("model.restore_from_path", d.pop("restore_from_path"), "restore_from_path")
    d.pop("restore_from_path")
    if "model.data.seq_length" in d.flat:
        v, enc = d.pop("model.data.seq_length"), d.out.get("model.encoder_seq_length", 512)
        if v != enc:
            d.problems.append(f"model.data.seq_length ({v}) must equal model.encoder_seq_length ({enc}): "
                              "the data are cut to the encoder's length here")
    name = d.pop("model.language_model.pretrained_model_name")
    if d.flat.get("model.language_model.lm_checkpoint") is not None:
        d.set("model.restore_from_path", d.pop("model.language_model.lm_checkpoint"),
              "model.language_model.lm_checkpoint")
    d.pop("model.language_model.lm_checkpoint")
    if name is not None:
        if name not in KNOWN_MODELS:
            d.problems.append(f"model.language_model.pretrained_model_name ({name!r}) must be one of "
                              f"{', '.join(KNOWN_MODELS)} (or give the shape with model.num_layers, hidden_size, ...)")
        elif d.out.get("model.restore_from_path") is not None:
            # The weights loaded decide the shape (formats/source.apply_source_shape): the name's shape set here
            # would outrank a checkpoint that records only its `size` (bert-base's 12 x 768 over a 345m or tiny run),
            # and the load fail on the first tensor after start-up.
            d.flat.setdefault("__model_name", name)
            d.ignored["model.language_model.pretrained_model_name"] = (
                f"the encoder's shape and weights come from model.restore_from_path, not from {name}")
        else:
            for k, v in KNOWN_MODELS[name][2].items():
                d.set(f"model.{k}", v, "model.language_model.pretrained_model_name")
            d.flat.setdefault("__model_name", name)
            if "model.restore_from_path" not in d.out:
                d.ignored["model.language_model.pretrained_model_name (weights)"] = (
                    f"NeMo downloads {name}'s weights; here give model.restore_from_path (a checkpoint from "
                    "`bio-megatron import`), or the encoder starts from random weights")
    renames = {"num_layers": "num_fc_layers", "num_fc_layers": "num_fc_layers", "dropout": "fc_dropout",
               "fc_dropout": "fc_dropout", "activation": "activation", "use_transformer_init": "use_transformer_init"}
    for key in [k for k in d.flat if k.startswith("model.token_classifier.")]:
        leaf = key.rsplit(".", 1)[1]
        if leaf in renames and task in ("ner", "qa"):
            d.set(f"model.head.{renames[leaf]}", d.pop(key), key)
    if task == "qa" and "model.token_classifier.num_classes" in d.flat:
        v = d.pop("model.token_classifier.num_classes")
        if v != 2:
            d.problems.append(f"model.token_classifier.num_classes ({v!r}) must be 2 here: start and end logits")


def _tokenizer(d: NemoDoc) -> None:
    library = d.pop("model.tokenizer.library")
    type_ = d.pop("model.tokenizer.type")
    hf_name = d.pop("model.tokenizer.tokenizer_name")
    model_name = d.pop("__model_name")
    vocab = d.pop("model.tokenizer.vocab_file")
    if library == "sentencepiece":
        _sentencepiece(d, vocab, type_ or hf_name)
        return
    if library not in (None, "megatron", "huggingface"):
        d.problems.append(f"model.tokenizer.library ({library!r}) must be 'megatron', 'huggingface' (WordPiece, "
                          "BPE) or 'sentencepiece' (ALBERT's spiece.model) here")
        return
    if type_ is not None and type_ not in MEGATRON_TOKENIZERS:
        d.problems.append(f"model.tokenizer.type ({type_!r}) must be one of {', '.join(MEGATRON_TOKENIZERS)}")
        return
    name = type_ or hf_name or model_name
    if name is not None and name not in MEGATRON_TOKENIZERS and name not in KNOWN_MODELS:
        d.problems.append(f"model.tokenizer.tokenizer_name ({name!r}) must be one of "
                          f"{', '.join([*KNOWN_MODELS, *MEGATRON_TOKENIZERS])} (WordPiece only)")
        return
    builtin, lower = (MEGATRON_TOKENIZERS.get(name) or KNOWN_MODELS[name][:2]) if name else (None, None)
    if vocab is None and name is not None and builtin is None:
        d.problems.append(f"model.tokenizer.vocab_file: {name} has no vocabulary built in here; give its vocab.txt")
    src = "model.tokenizer.vocab_file" if vocab is not None else "model.tokenizer.type"
    if vocab is not None or builtin is not None:
        d.set("model.tokenizer.vocab_file", vocab if vocab is not None else builtin, src)
    if lower is not None and "model.tokenizer.do_lower_case" not in d.out | d.flat:
        d.set("model.tokenizer.do_lower_case", lower, "model.tokenizer.type")


def _sentencepiece(d: NemoDoc, vocab: Any, name: Any) -> None:
    """NeMo's SentencePiece tokenizer: ``library: sentencepiece`` with the ``.model`` in ``tokenizer_model`` (NeMo's
    NLP configs; ``model`` in its Megatron configs) becomes ``model.tokenizer.vocab_file``, which every reader here
    takes (:func:`bio_megatron.vocab.bpe.load_tokenizer` knows a ``.model``)."""
    keys = ("model.tokenizer.tokenizer_model", "model.tokenizer.model")
    given = {k: v for k in keys if (v := d.pop(k)) is not None}
    if vocab is not None:
        given["model.tokenizer.vocab_file"] = vocab
    if name is not None:
        d.problems.append(f"model.tokenizer.type / tokenizer_name ({name!r}) name a WordPiece vocabulary: with "
                          "model.tokenizer.library=sentencepiece give only model.tokenizer.tokenizer_model=X.model")
        return
    if any(d.from_cli(k) for k in given):  # a command-line key wins over the recipe's (e.g. its vocab_file)
        given = {k: v for k, v in given.items() if d.from_cli(k)}
    if len(set(map(str, given.values()))) > 1:
        d.problems.append(" and ".join(f"{k} ({v!r})" for k, v in given.items()) + " name different files: keep one")
        return
    src, model = next(iter(given.items()), (None, None))
    if src is None or (src == "model.tokenizer.vocab_file" and not str(model).endswith(".model")):
        found = f" (model.tokenizer.vocab_file is {model!r})" if src else ""
        d.problems.append("model.tokenizer.library (sentencepiece) needs model.tokenizer.tokenizer_model=X.model "
                          f"(an ALBERT spiece.model from `bio-megatron vocab train --type sentencepiece`){found}")
        return
    if not str(model).endswith(".model") and not Path(str(model)).is_dir():
        d.problems.append(f"{src} ({model!r}) must be a SentencePiece .model file (an ALBERT spiece.model) with "
                          "model.tokenizer.library=sentencepiece")
        return
    d.set("model.tokenizer.vocab_file", model, src)


def _datasets(d: NemoDoc, task: str, world_size: int | None) -> None:
    accumulate = d.pop("__accumulate", 1)
    files = [f"model.{ds}.{k}" for ds in _DS_TARGET for k in (*_DS_FILE_KEYS[task], "labels_file")]
    if any(k in d.flat for k in files):
        # NeMo's own file formats (QA is SQuAD JSON either way; classify reads model.dataset.task_name's format
        # and has no format key, so none is written that the user would then see refused)
        if task in ("ner", "re"):
            d.set("model.dataset.format", "nemo", "model.train_ds")
        if task != "ner" and "model.dataset.data_dir" not in d.out:
            d.set("model.dataset.data_dir", ".", "model.train_ds")  # NeMo's paths are relative to the cwd
    for ds, target in _DS_TARGET.items():
        for k in _DS_FILE_KEYS[task]:
            key = f"model.{ds}.{k}"
            if key not in d.flat:
                continue
            v = d.pop(key)
            if v is None and ds != "test_ds":
                d.problems.append(f"{key} is null: NeMo needs it too; give {key}=PATH")
            elif v is not None or ds == "test_ds":
                d.set(f"model.dataset.{target}", v, key)
            labels = d.pop(f"model.{ds}.labels_file")
            if task == "ner" and v is not None and labels != str(v).replace("text_", "labels_", 1):
                d.problems.append(f"model.{ds}.labels_file ({labels!r}) must be {key} with text_ -> labels_ "
                                  f"({str(v).replace('text_', 'labels_', 1)!r}): NeMo NER files come in pairs")
        n = d.pop(f"model.{ds}.num_samples")
        if n is not None and n > 0:
            if ds == "train_ds":
                d.set("model.dataset.max_train_examples", n, f"model.{ds}.num_samples")
            else:
                d.set("model.dataset.max_eval_examples", n, f"model.{ds}.num_samples")
    if "model.train_ds.batch_size" in d.flat:
        bs = d.pop("model.train_ds.batch_size")
        dp = 1
        if world_size is not None:
            tp = d.out.get("model.tensor_model_parallel_size", 1) or 1
            pp = d.out.get("model.pipeline_model_parallel_size", 1) or 1
            dp = max(1, world_size // (tp * pp))
        # NeMo's batch_size is per GPU and accumulates k batches: ours are micro and global batches.
        d.set("model.micro_batch_size", bs, "model.train_ds.batch_size")
        d.set("model.global_batch_size", bs * accumulate * dp, "model.train_ds.batch_size")
    elif accumulate != 1:
        d.problems.append(f"trainer.accumulate_grad_batches ({accumulate}) needs model.train_ds.batch_size; "
                          "or set model.global_batch_size")

