"""Fine-tuned heads <-> Hugging Face: which class a head exports to, its weights and settings both ways.

A head that equals one of transformers' fixed heads exports to the plain ``MegatronBertFor*`` class (no
remote code); every other NeMo MLP head exports to the ``BioMegatronFor*`` class of
:mod:`bio_megatron.export.hf_modeling`, copied into the folder as ``modeling_bio_megatron.py`` and named in
``config.json``'s ``auto_map``. Its settings travel in ``config.json`` as ``bio_megatron_head`` and its
weights under our own names (``head.mlp.layer0.*``, ...).

This module imports neither transformers nor megatron: ``tasks.model.resolve_source`` reads HF folders with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    from bio_megatron.config.finetune import FinetuneModelConfig

PLAIN_CLASS = {"ner": "MegatronBertForTokenClassification", "qa": "MegatronBertForQuestionAnswering",
               "re": "MegatronBertForSequenceClassification"}
REMOTE_CLASS = {"ner": "BioMegatronForTokenClassification", "qa": "BioMegatronForQuestionAnswering",
                "re": "BioMegatronForSequenceClassification"}
AUTO_CLASS = {"ner": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering",
              "re": "AutoModelForSequenceClassification"}
# Original (post-LN) BERT's task classes compute the same heads under the same module names.
BERT_PLAIN_CLASS = {t: c.replace("MegatronBert", "Bert") for t, c in PLAIN_CLASS.items()}
CLASS_TASK = {**{c: t for t, c in PLAIN_CLASS.items()}, **{c: t for t, c in BERT_PLAIN_CLASS.items()},
              **{c: t for t, c in REMOTE_CLASS.items()}}
# A fine-tuned byte-level BPE (RoBERTa) model exports to these (export only: import hf reads RobertaModel /
# RobertaForMaskedLM folders). The heads are the plain classes' (same conditions, :func:`plain_class`).
ROBERTA_CLASS = {t: c.replace("MegatronBert", "Roberta") for t, c in PLAIN_CLASS.items()}
REMOTE_MODULE = "modeling_bio_megatron"
REMOTE_MODEL_TYPE = "bio-megatron-bert"
HEAD_KEYS = ("num_fc_layers", "fc_hidden_size", "activation", "fc_dropout")
_ACTIVATIONS = ("relu", "gelu", "tanh")
# Plain classes: HF key prefix -> our module, per task.
_PLAIN_PAIRS = {"ner": {"classifier": "head.mlp.layer0"}, "qa": {"qa_outputs": "head.mlp.layer0"},
                "re": {"bert.pooler.dense": "head.mlp.layer0", "classifier": "head.mlp.layer2"}}
# RoBERTa's sequence head is dense -> tanh -> out_proj on <s> (RobertaClassificationHead): the same computation as
# BERT's pooler + classifier at inference, under other names; its token and span heads are BERT's.
_ROBERTA_PAIRS = {**_PLAIN_PAIRS,
                  "re": {"classifier.dense": "head.mlp.layer0", "classifier.out_proj": "head.mlp.layer2"}}


def _block(task: str) -> tuple[str, str]:
    """The config block holding the head and its layer-count key (RE and classify keep NeMo's SequenceClassifier
    names)."""
    return ("classifier_head", "num_output_layers") if task in ("re", "classify") else ("head", "num_fc_layers")


def head_settings(task: str, model_cfg: FinetuneModelConfig) -> dict:
    """``{num_fc_layers, fc_hidden_size, activation, fc_dropout}`` of a task model config (``bio_megatron_head``)."""
    block, count = _block(task)
    h = getattr(model_cfg, block)
    return {"num_fc_layers": int(getattr(h, count)), "fc_hidden_size": model_cfg.fc_hidden_size,
            "activation": h.activation, "fc_dropout": float(h.fc_dropout)}


def plain_class(task: str, settings: dict, hidden_size: int) -> str | None:
    """The ``MegatronBertFor*`` class that computes exactly this head, or None when only remote code can."""
    if task in ("ner", "qa") and settings["num_fc_layers"] == 1:
        return PLAIN_CLASS[task]  # a single Linear: width and activation play no part
    if (task == "re" and settings["num_fc_layers"] == 2 and settings["activation"] == "tanh"
            and settings["fc_hidden_size"] in (None, hidden_size)):
        return PLAIN_CLASS[task]  # HF's tanh pooler over [CLS] + linear classifier
    return None


def head_to_hf(task: str, sd: dict, plain: bool, family: str = "bert") -> dict:
    """Our ``head.*`` weights under the HF class's names (unchanged for the remote-code classes); ``family``
    ``roberta`` names them as ``RobertaFor*`` does."""
    g = lambda k: sd[k].detach().clone().contiguous()  # noqa: E731
    if not plain:
        return {k: g(k) for k in sd if k.startswith("head.")}
    pairs = (_ROBERTA_PAIRS if family == "roberta" else _PLAIN_PAIRS)[task].items()
    return {f"{theirs}.{p}": g(f"{ours}.{p}") for theirs, ours in pairs for p in ("weight", "bias")}


def hf_to_head(task: str, hsd: dict) -> dict:
    """The ``head.*`` weights of an HF state dict, from either kind of class (KeyError names a missing weight)."""
    ours = {k: v for k, v in hsd.items() if k.startswith("head.")}
    if ours:
        return ours
    pairs = _PLAIN_PAIRS[task].items()
    return {f"{mine}.{p}": hsd[f"{theirs}.{p}"] for theirs, mine in pairs for p in ("weight", "bias")}


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


def source_head(arch: str, hf_cfg: dict, where: str) -> dict:
    """The head of an HF task folder (class ``arch``) in a checkpoint's ``config.yaml`` terms (``Source.head``)."""
    task = CLASS_TASK[arch]
    block, count = _block(task)
    if arch in (PLAIN_CLASS[task], BERT_PLAIN_CLASS[task]):  # exactly the head the plain class computes
        plain = {count: 2, "activation": "tanh"} if task == "re" else {count: 1}
        return {block: plain, "fc_hidden_size": None}
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


def remote_config_fields(task: str, settings: dict) -> dict:
    """What ``config.json`` of a remote-code folder adds: the class, where transformers finds it, the head."""
    cls = REMOTE_CLASS[task]
    auto_map = {"AutoConfig": f"{REMOTE_MODULE}.BioMegatronConfig", AUTO_CLASS[task]: f"{REMOTE_MODULE}.{cls}"}
    return {"architectures": [cls], "bio_megatron_head": dict(settings), "auto_map": auto_map}


def write_remote_code(folder: Path) -> Path:
    """Copy :mod:`bio_megatron.export.hf_modeling` verbatim beside config.json, where ``auto_map`` points."""
    dest = Path(folder) / f"{REMOTE_MODULE}.py"
    shutil.copyfile(Path(__file__).with_name("hf_modeling.py"), dest)
    return dest
