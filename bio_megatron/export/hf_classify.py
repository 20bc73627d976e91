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
"""

from __future__ import annotations

from bio_megatron.export.hf_heads import head_settings, plain_class
from bio_megatron.families import family_of_model
from bio_megatron.formats.source import Source
from bio_megatron.predict.classify import load_classifier
from bio_megatron.tasks.classify_data import dataset
from bio_megatron.utils.errors import CheckpointError

PROBLEM_TYPE = {"single": "single_label_classification", "regression": "regression",
                "multi": "multi_label_classification"}


def classify_to_hf(src: Source) -> tuple[dict, object, bool, list[str]]:
    """(HF state dict, config, tokenizer lower-casing, labels) of a classify checkpoint at TP1, for ``export_hf``."""
    loaded = load_classifier(src.path)
    m, shape, tok = loaded.cfg.model, loaded.model.shape, loaded.tokenizer
    family = family_of_model(m)
    settings = head_settings("classify", m)
    if family.tokenizer_kind == "bpe" and not getattr(family, "owns_task_heads", False):
        raise CheckpointError(f"{src.path}: a byte-level BPE ({family.name}) classify model has no export here yet "
                              "(only WordPiece BERT / MegatronBERT sequence classifiers)")
    cls = plain_class("classify", settings, shape.hidden_size, family)
    if cls is None:
        raise CheckpointError(
            f"{src.path}: this classify head ({settings}) has no Hugging Face class: {family.hf_class('classify')} "
            f"computes a tanh pooler as wide as the encoder ({shape.hidden_size}) and one linear classifier, i.e. "
            "model.classifier_head.num_output_layers=2, model.classifier_head.activation=tanh, "
            "model.fc_hidden_size=null; fine-tune with those to export")
    problems = family.export_problems(m, "classify")
    if problems:
        raise CheckpointError(f"{src.path}: {cls} cannot compute this model: " + "; ".join(problems))
    sd = loaded.model.state_dict()
    tokens = family.hf_tokens(tok)  # the special-token ids the family's config records (ModernBERT's)
    hsd = {**family.to_hf(sd, m, tok.vocab_size, binary_head=False, **tokens), **family.head_to_hf("classify", sd)}
    labels = list(loaded.labels)
    task_name = m.dataset.task_name
    config = family.hf_config(m, tok.vocab_size, **tokens, architectures=[cls], num_labels=len(labels),
                              id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)},
                              problem_type=PROBLEM_TYPE[dataset(task_name).mode], finetuning_task=task_name)
    return hsd, config, tok.lowercase, labels
