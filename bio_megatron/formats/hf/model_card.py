"""The model card (``README.md``) of every ``export hf`` folder: the Hub's YAML metadata header and a short body.

Header keys (https://huggingface.co/docs/hub/model-cards): ``library_name: transformers``, ``language: en``,
``pipeline_tag`` (from the task), ``tags`` (``biomedical``, ``bio-megatron``, the family, the task),
``base_model`` when the fine-tuning started from a Hub id (a local path is named in the body instead: the Hub
reads ``base_model`` as a model id), ``datasets`` (the BLURB task name or the training file's stem) and, when
the run's ``results.json`` belongs to this checkpoint, ``metrics`` plus a ``model-index`` with the dev/test
scores. The body says what the model is, what it was trained on, its scores and how to load it.
Nothing here is invented: a key whose value is unknown is left out.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml

from bio_megatron.families import FAMILIES
from bio_megatron.families.megatron_bert import MEGATRON_BERT
from bio_megatron.formats.saved import saved_config
from bio_megatron.utils.errors import CheckpointError

PIPELINE_TAG = {"ner": "token-classification", "qa": "question-answering", "re": "text-classification",
                "classify": "text-classification", None: "fill-mask"}
AUTO_CLASS = {"ner": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering",
              "re": "AutoModelForSequenceClassification", "classify": "AutoModelForSequenceClassification",
              None: "AutoModelForMaskedLM"}
# results.json keys that are counts or bookkeeping, not scores
_NOT_SCORES = re.compile(r"^(found_|tokens$|correct$|n_|num_|count|total|step|examples|support)")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _run_config(checkpoint: Path) -> dict:
    try:
        return saved_config(checkpoint)
    except CheckpointError:  # the card is documentation: a config the export could read is enough
        return {}


def _results(checkpoint: Path) -> dict:
    """The fine-tuning run's ``results.json`` (beside ``checkpoints/``) when it names this checkpoint."""
    for folder in (checkpoint, *list(checkpoint.parents)[:2]):
        file = folder / "results.json"
        if not file.is_file():
            continue
        try:
            res = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(res, dict):
            return {}
        named = res.get("checkpoint")  # an earlier best checkpoint's scores (or a sweep's summary) are not this one's
        return res if named and Path(str(named)).resolve() == checkpoint.resolve() else {}
    return {}


def _scores(split: dict | None) -> dict[str, float]:
    """Numeric scores of a results.json split; BLURB's headline ``{"metric": name, "score": value}`` under its name."""
    if not isinstance(split, dict):
        return {}
    out = {k: round(float(v), 4) for k, v in split.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and not _NOT_SCORES.match(k) and k != "score"}
    if isinstance(split.get("metric"), str) and isinstance(split.get("score"), (int, float)):
        out = {split["metric"]: round(float(split["score"]), 4), **out}
    return out


def card_fields(checkpoint: str | Path, task: str | None) -> dict:
    """What the card says: base model, data, scores (dev/test), read from the checkpoint's own files."""
    checkpoint = Path(checkpoint)
    model = _run_config(checkpoint).get("model") or {}
    data = model.get("dataset") or {}
    base = model.get("restore_from_path")
    dataset = data.get("task_name") or (Path(str(data["train_file"])).stem if data.get("train_file") else None)
    res = _results(checkpoint)
    prefixes = (model.get("data") or {}).get("data_prefix") if task is None else None  # pretraining: weight, path...
    corpus = [str(p) for p in prefixes if not isinstance(p, (int, float))] if isinstance(prefixes, list) else []
    return {"base": str(base) if base else None, "dataset": dataset, "data_dir": data.get("data_dir"),
            "train_file": data.get("train_file"), "corpus": corpus,
            "dev": _scores(res.get("dev")), "test": _scores(res.get("test"))}


def _family_tag(cls: str) -> str:
    """The Hub tag (HF ``model_type``) of the family whose classes ``cls`` belongs to (``BertFor*`` -> bert, ...);
    the remote-code ``BioMegatronFor*`` classes wrap Megatron BERT."""
    prefix = cls.split("For")[0]
    for family in FAMILIES.values():
        if family.hf_class(None).split("For")[0] == prefix:
            return family.hf_model_types[0]
    return MEGATRON_BERT.hf_model_types[0]


def metadata(fields: dict, task: str | None, cls: str, name: str) -> dict:
    tag = PIPELINE_TAG.get(task, "fill-mask")
    if cls == "ElectraForPreTraining":  # a discriminator: replaced-token detection, no masked-LM head
        tag = "feature-extraction"
    meta: dict = {"library_name": "transformers", "language": "en", "pipeline_tag": tag}
    meta["tags"] = ["biomedical", "bio-megatron", _family_tag(cls)] + ([task] if task else ["pretraining"])
    if fields["base"] and _HUB_ID.match(fields["base"]) and not Path(fields["base"]).exists():
        meta["base_model"] = fields["base"]
    if fields["dataset"]:
        meta["datasets"] = [fields["dataset"]]
    scored = {k: v for k, v in (("dev", fields["dev"]), ("test", fields["test"])) if v}
    if scored:
        meta["metrics"] = sorted({m for s in scored.values() for m in s})
        meta["model-index"] = [{"name": name, "results": [
            {"task": {"type": meta["pipeline_tag"]},
             "dataset": {"name": fields["dataset"] or "unknown", "type": fields["dataset"] or "unknown",
                         "split": "validation" if split == "dev" else "test"},
             "metrics": [{"type": m, "value": v, "name": f"{split} {m}"} for m, v in s.items()]}
            for split, s in scored.items()]}]
    return meta


def _usage(task: str | None, remote: bool, cls: str) -> str:
    trust = ", trust_remote_code=True" if remote else ""
    if task == "ner":  # "first": the tag of each word's first sub-token, as in fine-tuning and `predict ner`
        return ("from transformers import pipeline\n\n"
                "ner = pipeline(\"token-classification\", model=\"PATH_OR_HUB_ID\", "
                f"aggregation_strategy=\"first\"{trust})\n"
                "ner(\"Naloxone reverses the antihypertensive effect of clonidine.\")")
    if task == "qa":
        return ("from transformers import pipeline\n\n"
                f"qa = pipeline(\"question-answering\", model=\"PATH_OR_HUB_ID\"{trust})\n"
                "qa(question=\"What does naloxone reverse?\", context=\"Naloxone reverses the effect of clonidine.\")")
    if task in ("re", "classify"):
        return ("from transformers import pipeline\n\n"
                f"classify = pipeline(\"text-classification\", model=\"PATH_OR_HUB_ID\", top_k=None{trust})\n"
                "classify(\"@CHEMICAL$ reverses the effect of @GENE$.\")")
    return (f"from transformers import AutoTokenizer, {cls}\n\n"  # the exact class: ELECTRA's discriminator has no MLM
            "tokenizer = AutoTokenizer.from_pretrained(\"PATH_OR_HUB_ID\")\n"
            f"model = {cls}.from_pretrained(\"PATH_OR_HUB_ID\")")


def model_card(checkpoint: str | Path, task: str | None, cls: str, remote: bool, labels: list[str] | None,
               dtype: str, name: str) -> str:
    """The README.md text of an export of ``checkpoint`` (``cls``: the class in config.json)."""
    fields = card_fields(checkpoint, task)
    head = yaml.safe_dump(metadata(fields, task, cls, name), sort_keys=False, allow_unicode=True)
    what = f"a fine-tuned `{task}` model" if task else "a pretrained encoder (masked language model)"
    lines = [f"---\n{head}---", "", f"# {name}", "",
             f"{what.capitalize()} trained with BioMegatron (Megatron-Core), exported to Hugging Face transformers "
             f"as `{cls}` ({dtype} weights" + ("; the head's code is in this folder: load with "
                                               "`trust_remote_code=True`)." if remote else ")."), ""]
    if labels:
        lines += ["Labels (`config.json` `id2label`): " + ", ".join(f"`{t}`" for t in labels) + ".", ""]
    lines += ["## Data", ""]
    if fields["dataset"]:
        where = f" (`{fields['data_dir']}/{fields['train_file']}`)" if fields["train_file"] else ""
        lines.append(f"Fine-tuned on `{fields['dataset']}`{where}.")
    elif fields["corpus"]:
        lines.append("Pretrained on the indexed corpus " + ", ".join(f"`{p}`" for p in fields["corpus"]) + ".")
    else:
        lines.append("The training data is not recorded in the checkpoint.")
    if fields["base"]:
        lines.append(f"Initialised from `{fields['base']}`.")
    lines += ["", "## Metrics", ""]
    if fields["dev"] or fields["test"]:
        names = sorted(set(fields["dev"]) | set(fields["test"]))
        lines += ["| metric | dev | test |", "|---|---|---|"]
        lines += [f"| {m} | {fields['dev'].get(m, '')} | {fields['test'].get(m, '')} |" for m in names]
    else:
        lines.append("No scores recorded for this checkpoint (no matching `results.json` beside it).")
    lines += ["", "## How to use", "", "```python", _usage(task, remote, cls), "```", "",
              f"Exported from `{Path(checkpoint).name}` by `bio-megatron export hf`; "
              "`bio_megatron_export.json` records the source.", ""]
    return "\n".join(lines)


CARD_DIGEST_KEY = "model_card_sha256"  # in bio_megatron_export.json: tells our card from one the user edited


def card_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def refuse_edited_card(out: str | Path) -> None:
    """Before ``--overwrite`` replaces an earlier export: a ``README.md`` that is no longer the card we wrote
    (users fill in model cards) is refused, one line, instead of being replaced with a fresh one."""
    from bio_megatron.utils.errors import OutputError

    card, info = Path(out) / "README.md", Path(out) / "bio_megatron_export.json"
    if not card.is_file() or not info.is_file():
        return
    try:
        recorded = json.loads(info.read_text(encoding="utf-8")).get(CARD_DIGEST_KEY)
    except (OSError, ValueError, AttributeError):
        return  # not our export record: the output marker's own check decides
    if recorded and hashlib.sha256(card.read_bytes()).hexdigest() != recorded:
        raise OutputError(f"{card}: edited since `export hf` wrote it; --overwrite would replace it with a new "
                          "card: move it away (or merge it in afterwards) or choose a new folder")
