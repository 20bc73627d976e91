"""``export hf`` of a fine-tuned BLURB ``classify`` checkpoint: its family's sequence classifier
(``BertForSequenceClassification`` post-LN, ``MegatronBertForSequenceClassification`` pre-LN, ...) with the
dataset's ``problem_type``.

transformers' sequence head is a tanh pooler over [CLS] as wide as the encoder, then one linear classifier:
exactly our NeMo head with ``model.classifier_head.num_output_layers: 2``, ``activation: tanh`` and
``model.fc_hidden_size`` null (or the encoder width) (``head.mlp.layer0`` -> ``bert.pooler.dense``,
``head.mlp.layer2`` -> ``classifier``, the names RE exports with). Any other NeMo MLP (one layer, relu, another
width) has no such class and is refused, naming the settings that would export. ``problem_type``:

=============  =================================  ==================================================
mode           datasets                           config.json
=============  =================================  ==================================================
single         PubMedQA, BioASQ yes/no, DDI, GAD  ``single_label_classification``, id2label = labels
regression     BIOSSES                            ``regression``, ``num_labels: 1``
multi          HoC                                ``multi_label_classification``, id2label = hallmarks
=============  =================================  ==================================================

``finetuning_task`` holds the BLURB task name. Reading such a folder back (``import hf``, ``finetune`` from
it) sees transformers' class and treats it as the ``re`` head's class: fine-tuning from it uses its encoder.

The checkpoint goes through :func:`bio_megatron.formats.ours.read_ours` and
:func:`bio_megatron.formats.hf.convert.state_to_hf` like every other task. Only the BLURB dataset's labels (for a
checkpoint without ``label_ids.csv``) and mode come from ``tasks/``, which sits above ``formats/``: the caller hands
them down as a :data:`ClassifyDataset` (``bio-megatron export hf``: :func:`bio_megatron.cli.convert.classify_dataset`).
"""

from __future__ import annotations

from typing import Callable

from bio_megatron.config.finetune import CONFIG_CLASSES
from bio_megatron.config.loader import from_dict
from bio_megatron.families import Family
from bio_megatron.formats.hf.heads import plain_class
from bio_megatron.formats.saved import saved_config
from bio_megatron.formats.source import Source
from bio_megatron.utils.errors import CheckpointError, ConfigError

PROBLEM_TYPE = {"single": "single_label_classification", "regression": "regression",
                "multi": "multi_label_classification"}

ClassifyDataset = Callable[[str], tuple[list[str], str]]
"""A BLURB dataset's name -> (its labels, its mode: ``single`` | ``regression`` | ``multi``)."""


def classify_export_fields(src: Source, classify_dataset: ClassifyDataset | None) -> tuple[list[str], dict]:
    """(default labels, ``config.json`` fields ``problem_type`` and ``finetuning_task``) of classify checkpoint
    ``src``, from its saved config and its dataset; no weight is read."""
    if classify_dataset is None:
        raise ConfigError(f"{src.path}: a classify model exports with its BLURB dataset's labels and problem type; "
                          "export_hf needs classify_dataset (bio-megatron export hf passes it)")
    task_name = from_dict(CONFIG_CLASSES["classify"], saved_config(src.path)).model.dataset.task_name
    labels, mode = classify_dataset(task_name)
    return list(labels), {"problem_type": PROBLEM_TYPE[mode], "finetuning_task": task_name}


def classify_problems(source: str, family: Family, settings: dict, hidden: int) -> None:
    """Refuse (CheckpointError) a classify model no sequence class of its family computes: a byte-level BPE family
    without task heads of its own, or a head other than transformers' tanh pooler + linear classifier."""
    if family.tokenizer_kind == "bpe" and not getattr(family, "owns_task_heads", False):
        raise CheckpointError(f"{source}: a byte-level BPE ({family.name}) classify model has no export here yet "
                              "(only WordPiece BERT / MegatronBERT sequence classifiers)")
    if plain_class("classify", settings, hidden, family) is None:
        raise CheckpointError(
            f"{source}: this classify head ({settings}) has no Hugging Face class: {family.hf_class('classify')} "
            f"computes a tanh pooler as wide as the encoder ({hidden}) and one linear classifier, i.e. "
            "model.classifier_head.num_output_layers=2, model.classifier_head.activation=tanh, "
            "model.fc_hidden_size=null; fine-tune with those to export")
