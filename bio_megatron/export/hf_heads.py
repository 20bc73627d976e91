"""Fine-tuned heads <-> Hugging Face: which class a head exports to, its weights and settings both ways.

A head that equals one of transformers' fixed heads exports to the plain ``MegatronBertFor*`` class (no
remote code); every other NeMo MLP head exports to the ``BioMegatronFor*`` class of
:mod:`bio_megatron.export.hf_modeling`, copied into the folder as ``modeling_bio_megatron.py`` and named in
``config.json``'s ``auto_map``. Its settings travel in ``config.json`` as ``bio_megatron_head`` and its
weights under our own names (``head.mlp.layer0.*``, ...).

The class tables and the reading half (``source_head``, ``hf_to_head``, ``apply_head``) are
:mod:`bio_megatron.loading.hf_heads`: loading a folder needs them, exporting one needs both.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from bio_megatron.loading.hf_heads import PLAIN_CLASS, PLAIN_PAIRS, REMOTE_CLASS, head_block

if TYPE_CHECKING:
    from bio_megatron.config.finetune import FinetuneModelConfig

AUTO_CLASS = {"ner": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering",
              "re": "AutoModelForSequenceClassification"}
# A fine-tuned byte-level BPE (RoBERTa) model exports to these (export only: import hf reads RobertaModel /
# RobertaForMaskedLM folders). The heads are the plain classes' (same conditions, :func:`plain_class`).
ROBERTA_CLASS = {t: c.replace("MegatronBert", "Roberta") for t, c in PLAIN_CLASS.items()}
REMOTE_MODULE = "modeling_bio_megatron"
# RoBERTa's sequence head is dense -> tanh -> out_proj on <s> (RobertaClassificationHead): the same computation as
# BERT's pooler + classifier at inference, under other names; its token and span heads are BERT's.
_ROBERTA_PAIRS = {**PLAIN_PAIRS,
                  "re": {"classifier.dense": "head.mlp.layer0", "classifier.out_proj": "head.mlp.layer2"}}


def head_settings(task: str, model_cfg: FinetuneModelConfig) -> dict:
    """``{num_fc_layers, fc_hidden_size, activation, fc_dropout}`` of a task model config (``bio_megatron_head``)."""
    block, count = head_block(task)
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
    pairs = (_ROBERTA_PAIRS if family == "roberta" else PLAIN_PAIRS)[task].items()
    return {f"{theirs}.{p}": g(f"{ours}.{p}") for theirs, ours in pairs for p in ("weight", "bias")}


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
