"""Task heads with NeMo's semantics, replicated on every tensor-parallel rank of the last pipeline stage.

* :class:`TokenClassifier` (NER, and QA with 2 classes): dropout on every token's hidden state, then an
  MLP of ``num_fc_layers`` Linear layers (the count includes the output layer), activation between.
  Module names follow NeMo's ``MultiLayerPerceptron`` (``mlp.layer0``, ``mlp.layer2``, ...).
* :class:`SequenceClassifier` (RE, BLURB classify): the same over the [CLS] position.
* :func:`spanning_loss`: QA's mean of the start and end cross entropies.

The paper's ``fc_hidden_size`` sets the width of the hidden layers (NeMo always used the encoder width).
Model parts, below fine-tuning and loading alike: ``loading`` builds a checkpoint's head with :func:`build_head`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


class MultiLayerPerceptron(nn.Module):
    """``num_layers`` Linear layers; hidden layers are ``fc_hidden_size`` wide with ``activation`` after each."""

    def __init__(self, hidden_size: int, num_classes: int, num_layers: int, fc_hidden_size: int | None,
                 activation: str):
        super().__init__()
        width = fc_hidden_size or hidden_size
        self.num_layers = num_layers
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


class TokenClassifier(nn.Module):
    """Per-token logits ``[b, s, num_classes]`` from hidden states ``[b, s, h]``."""

    def __init__(self, hidden_size: int, num_classes: int, num_layers: int = 2, fc_hidden_size: int | None = None,
                 activation: str = "relu", dropout: float = 0.5, use_transformer_init: bool = True):
        super().__init__()
        self.use_transformer_init = use_transformer_init
        self.dropout = nn.Dropout(dropout)
        self.mlp = MultiLayerPerceptron(hidden_size, num_classes, num_layers, fc_hidden_size, activation)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.dropout(hidden))


class SequenceClassifier(TokenClassifier):
    """Logits ``[b, num_classes]`` from the [CLS] position (index 0), as NeMo's SequenceClassifier."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.dropout(hidden)[:, 0])


def spanning_loss(logits: torch.Tensor, start_positions: torch.Tensor, end_positions: torch.Tensor) -> torch.Tensor:
    """QA loss: mean of the start and end cross entropies over ``logits[..., 0]`` / ``logits[..., 1]``."""
    start_logits, end_logits = logits.float().unbind(-1)
    return (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2


def token_loss(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross entropy over positions whose label is not -100 (optionally class-weighted, NeMo's
    ``class_balancing: weighted_loss``); 0 when a micro-batch has no labelled position."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    if not bool((target != -100).any()):
        return flat.sum() * 0.0
    return F.cross_entropy(flat, target, weight=weight, ignore_index=-100)


@torch.no_grad()
def pytorch_default_init(head: nn.Module, prefix: str, seed: int, skip: Collection[str] = frozenset()) -> None:
    """PyTorch's Linear init U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, drawn from a
    generator seeded by the parameter's name so that every rank and layout gets the same values; ``skip``: the
    names (with ``prefix``) filled from a checkpoint already."""
    for name, p in head.named_parameters():
        module = head.get_submodule(name.rsplit(".", 1)[0])
        if not isinstance(module, nn.Linear) or prefix + name in skip:
            continue
        bound = 1.0 / math.sqrt(module.in_features)
        g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{prefix}{name}".encode()))
        p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)


def build_head(task: str, model_cfg, hidden_size: int, num_classes: int) -> nn.Module:
    """The head a task config asks for (``model.head`` / ``model.classifier_head`` + ``model.fc_hidden_size``)."""
    if getattr(model_cfg, "family", None) == "modernbert":  # its HF task classes' own head (models/modernbert.py)
        from bio_megatron.models.modernbert import modernbert_task_head

        return modernbert_task_head(task, model_cfg, hidden_size, num_classes)
    if task in ("re", "classify"):  # NeMo's SequenceClassifier names (model.classifier_head)
        h = model_cfg.classifier_head
        return SequenceClassifier(hidden_size, num_classes, h.num_output_layers, model_cfg.fc_hidden_size,
                                  h.activation, h.fc_dropout, h.use_transformer_init)
    h = model_cfg.head
    return TokenClassifier(hidden_size, 2 if task == "qa" else num_classes, h.num_fc_layers, model_cfg.fc_hidden_size,
                           h.activation, h.fc_dropout, h.use_transformer_init)
