"""Fine-tuned heads <-> Hugging Face: which class a head exports to, its weights and settings both ways.

A head that equals one of transformers' fixed heads exports to the family's plain class (``MegatronBertFor*``,
``BertFor*``, ...: :mod:`bio_megatron.families`; no remote code); every other NeMo MLP head exports to the ``BioMegatronFor*`` class of
:mod:`bio_megatron.formats.hf.modeling`, copied into the folder as ``modeling_bio_megatron.py`` and named in
``config.json``'s ``auto_map``. Its settings travel in ``config.json`` as ``bio_megatron_head`` and its
weights under our own names (``head.mlp.layer0.*``, ...).

The class table and the reading half (``source_head``, ``hf_to_head``, ``apply_head``) are
:mod:`bio_megatron.formats.hf.read`: loading a folder needs them, exporting one needs both.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from bio_megatron.families import Family
from bio_megatron.families.megatron_bert import MEGATRON_BERT
from bio_megatron.formats.hf.read import REMOTE_CLASS, head_block

if TYPE_CHECKING:
    from bio_megatron.config.finetune import FinetuneModelConfig

AUTO_CLASS = {"ner": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering",
              "re": "AutoModelForSequenceClassification"}
REMOTE_MODULE = "modeling_bio_megatron"


def head_settings(task: str, model_cfg: FinetuneModelConfig) -> dict:
    """``{num_fc_layers, fc_hidden_size, activation, fc_dropout}`` of a task model config (``bio_megatron_head``)."""
    block, count = head_block(task)
    h = getattr(model_cfg, block)
    return {"num_fc_layers": int(getattr(h, count)), "fc_hidden_size": model_cfg.fc_hidden_size,
            "activation": h.activation, "fc_dropout": float(h.fc_dropout)}


def plain_class(task: str, settings: dict, hidden_size: int, family: Family = MEGATRON_BERT) -> str | None:
    """The ``family``'s transformers class that computes exactly this head, or None when only remote code can."""
    if getattr(family, "owns_task_heads", False):  # the family builds its HF classes' own head (ModernBERT)
        return family.hf_class(task)
    if task in ("ner", "qa") and settings["num_fc_layers"] == 1:
        return family.hf_class(task)  # a single Linear: width and activation play no part
    if (task in ("re", "classify") and settings["num_fc_layers"] == 2 and settings["activation"] == "tanh"
            and settings["fc_hidden_size"] in (None, hidden_size)):
        return family.hf_class(task)  # HF's tanh pooler over [CLS] + linear classifier
    return None


def remote_head(sd: dict) -> dict:
    """Our ``head.*`` weights as the remote-code classes keep them (under our names); a family's plain class
    names them itself (``Family.head_to_hf``)."""
    return {k: sd[k].detach().clone().contiguous() for k in sd if k.startswith("head.")}


def remote_config_fields(task: str, settings: dict) -> dict:
    """What ``config.json`` of a remote-code folder adds: the class, where transformers finds it, the head."""
    cls = REMOTE_CLASS[task]
    auto_map = {"AutoConfig": f"{REMOTE_MODULE}.BioMegatronConfig", AUTO_CLASS[task]: f"{REMOTE_MODULE}.{cls}"}
    return {"architectures": [cls], "bio_megatron_head": dict(settings), "auto_map": auto_map}


def write_remote_code(folder: Path) -> Path:
    """Copy :mod:`bio_megatron.formats.hf.modeling` verbatim beside config.json, where ``auto_map`` points."""
    dest = Path(folder) / f"{REMOTE_MODULE}.py"
    shutil.copyfile(Path(__file__).with_name("modeling.py"), dest)
    return dest
