"""BioMegatron task models for Hugging Face ``transformers`` (remote code: ``trust_remote_code=True``).

``bio-megatron export hf`` copies this file verbatim into an exported folder as ``modeling_bio_megatron.py``
when the fine-tuned head is not one of transformers' fixed ``MegatronBertFor*`` heads. It must therefore
import nothing but ``torch`` and ``transformers``.

The encoder is transformers' own ``MegatronBertModel``; the head is NeMo's: dropout, then an MLP of
``num_fc_layers`` Linear layers (the count includes the output layer) with ``activation`` between and hidden
layers ``fc_hidden_size`` wide (``None``: the encoder width). Module names (``head.dropout``,
``head.mlp.layer0``, ``head.mlp.layer2``, ...) are BioMegatron's, so the weights map one to one.

* ``BioMegatronForTokenClassification`` (NER): the head on every token.
* ``BioMegatronForQuestionAnswering``: the head with 2 outputs per token, split into start / end logits.
* ``BioMegatronForSequenceClassification`` (RE): the head on the [CLS] position.

Loading::

    from transformers import AutoModelForTokenClassification, pipeline
    model = AutoModelForTokenClassification.from_pretrained(folder, trust_remote_code=True)
    ner = pipeline("token-classification", model=folder, trust_remote_code=True)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import MegatronBertConfig
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput, TokenClassifierOutput
from transformers.models.megatron_bert.modeling_megatron_bert import MegatronBertModel, MegatronBertPreTrainedModel

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
Tensor = torch.Tensor | None


class BioMegatronConfig(MegatronBertConfig):
    """``MegatronBertConfig`` plus ``bio_megatron_head``: ``{num_fc_layers, fc_hidden_size, activation,
    fc_dropout}``. Its own ``model_type`` makes loading without ``trust_remote_code`` fail loudly instead
    of silently building transformers' plain head with random weights."""

    model_type = "bio-megatron-bert"

    def __init__(self, bio_megatron_head: dict | None = None, **kwargs):
        head = {"num_fc_layers": 1, "fc_hidden_size": None, "activation": "relu", "fc_dropout": 0.1}
        head.update(bio_megatron_head or {})
        self.bio_megatron_head = head
        super().__init__(**kwargs)


class MultiLayerPerceptron(nn.Module):
    """``layer0, layer1 (activation), layer2, ...``: NeMo's module names."""

    def __init__(self, hidden_size: int, num_classes: int, num_layers: int, fc_hidden_size: int | None,
                 activation: str):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"bio_megatron_head.activation={activation!r}: expected one of {sorted(_ACTIVATIONS)}")
        if num_layers < 1:
            raise ValueError(f"bio_megatron_head.num_fc_layers={num_layers}: must be >= 1")
        width = fc_hidden_size or hidden_size
        d, idx = hidden_size, 0
        for _ in range(num_layers - 1):
            setattr(self, f"layer{idx}", nn.Linear(d, width))
            setattr(self, f"layer{idx + 1}", _ACTIVATIONS[activation]())
            d, idx = width, idx + 2
        setattr(self, f"layer{idx}", nn.Linear(d, num_classes))
        self.last = idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.last + 1):
            x = getattr(self, f"layer{i}")(x)
        return x


class BioMegatronHead(nn.Module):
    """Dropout on the hidden states, then the MLP (NeMo's TokenClassifier / SequenceClassifier)."""

    def __init__(self, config: MegatronBertConfig, num_classes: int):
        super().__init__()
        h = config.bio_megatron_head
        self.dropout = nn.Dropout(h["fc_dropout"])
        self.mlp = MultiLayerPerceptron(config.hidden_size, num_classes, h["num_fc_layers"], h["fc_hidden_size"],
                                        h["activation"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.dropout(hidden))


class _BioMegatronBase(MegatronBertPreTrainedModel):
    config_class = BioMegatronConfig

    def __init__(self, config: MegatronBertConfig, num_classes: int):
        super().__init__(config)
        self.num_labels = config.num_labels
        # No pooler: NeMo's heads read the encoder's last hidden states (RE takes [CLS] itself).
        self.bert = MegatronBertModel(config, add_pooling_layer=False)
        self.head = BioMegatronHead(config, num_classes)
        self.post_init()

    def _encode(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, position_ids: Tensor,
                inputs_embeds: Tensor, output_attentions: bool | None, output_hidden_states: bool | None):
        return self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         position_ids=position_ids, inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states, return_dict=True)

    def _return_dict(self, return_dict: bool | None) -> bool:
        return return_dict if return_dict is not None else getattr(self.config, "return_dict", True)

    @staticmethod
    def _as_tuple(loss: Tensor | None, outputs: tuple, out) -> tuple:
        """transformers' tuple form: (loss,) when computed, the outputs, then hidden states / attentions."""
        rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
        return ((loss,) if loss is not None else ()) + outputs + rest


class BioMegatronForTokenClassification(_BioMegatronBase):
    """Per-token logits ``[b, s, num_labels]``; loss: cross entropy ignoring label -100 (transformers' rule)."""

    def __init__(self, config: MegatronBertConfig):
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: Tensor = None, attention_mask: Tensor = None, token_type_ids: Tensor = None,
                position_ids: Tensor = None, inputs_embeds: Tensor = None, labels: Tensor = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        if not self._return_dict(return_dict):
            return self._as_tuple(loss, (logits,), out)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                     attentions=out.attentions)


class BioMegatronForQuestionAnswering(_BioMegatronBase):
    """Start / end logits ``[b, s]`` from the head's two outputs per token; loss: the mean of the start and end
    cross entropies, positions outside the sequence ignored (transformers' rule)."""

    def __init__(self, config: MegatronBertConfig):
        super().__init__(config, 2)

    def forward(self, input_ids: Tensor = None, attention_mask: Tensor = None, token_type_ids: Tensor = None,
                position_ids: Tensor = None, inputs_embeds: Tensor = None, start_positions: Tensor = None,
                end_positions: Tensor = None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.head(out.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            if start_positions.dim() > 1:
                start_positions = start_positions.squeeze(-1)
            if end_positions.dim() > 1:
                end_positions = end_positions.squeeze(-1)
            ignored = start_logits.size(1)
            loss_fct = CrossEntropyLoss(ignore_index=ignored)
            loss = (loss_fct(start_logits, start_positions.clamp(0, ignored))
                    + loss_fct(end_logits, end_positions.clamp(0, ignored))) / 2
        if not self._return_dict(return_dict):
            return self._as_tuple(loss, (start_logits, end_logits), out)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=out.hidden_states, attentions=out.attentions)


class BioMegatronForSequenceClassification(_BioMegatronBase):
    """Logits ``[b, num_labels]`` from the [CLS] position; loss chosen by ``config.problem_type`` as transformers'
    sequence classifiers do (regression, single- or multi-label)."""

    def __init__(self, config: MegatronBertConfig):
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: Tensor = None, attention_mask: Tensor = None, token_type_ids: Tensor = None,
                position_ids: Tensor = None, inputs_embeds: Tensor = None, labels: Tensor = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        # Dropout over the whole sequence then [CLS], as NeMo's SequenceClassifier (identical in eval mode).
        logits = self.head.mlp(self.head.dropout(out.last_hidden_state)[:, 0])
        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                loss = MSELoss()(logits.squeeze(), labels.squeeze()) if self.num_labels == 1 else \
                    MSELoss()(logits, labels)
            elif self.config.problem_type == "single_label_classification":
                loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                loss = BCEWithLogitsLoss()(logits, labels)
        if not self._return_dict(return_dict):
            return self._as_tuple(loss, (logits,), out)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions)
