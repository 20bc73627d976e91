"""Head semantics (NeMo's MultiLayerPerceptron naming and layer count, the paper's fc_hidden_size), the
spanning loss, class-weighted token loss and the layout-independent PyTorch-default init."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bio_megatron.models.heads import (SequenceClassifier, TokenClassifier, pytorch_default_init, spanning_loss,
                                      token_loss)


def test_num_fc_layers_counts_the_output_layer_and_width_is_fc_hidden_size():
    one = TokenClassifier(64, 3, num_layers=1)
    assert [n for n, _ in one.named_parameters()] == ["mlp.layer0.weight", "mlp.layer0.bias"]
    two = TokenClassifier(64, 3, num_layers=2, fc_hidden_size=512, activation="relu")
    assert two.mlp.layer0.weight.shape == (512, 64) and two.mlp.layer2.weight.shape == (3, 512)
    assert isinstance(two.mlp.layer1, torch.nn.ReLU)
    nemo_width = TokenClassifier(64, 3, num_layers=2)  # fc_hidden_size None: the encoder width, as NeMo
    assert nemo_width.mlp.layer0.weight.shape == (64, 64)
    h = torch.randn(2, 5, 64)
    assert two.eval()(h).shape == (2, 5, 3)
    seq = SequenceClassifier(64, 6, num_layers=2, activation="tanh").eval()
    assert torch.equal(seq(h), seq.mlp(h[:, 0]))  # over [CLS] only


def test_spanning_loss_is_mean_of_start_and_end_cross_entropy():
    logits = torch.randn(3, 7, 2)
    s, e = torch.tensor([0, 3, 6]), torch.tensor([0, 4, 6])
    expected = (F.cross_entropy(logits[..., 0], s) + F.cross_entropy(logits[..., 1], e)) / 2
    assert torch.allclose(spanning_loss(logits, s, e), expected)


def test_weighted_token_loss_ignores_masked_positions():
    logits = torch.randn(2, 4, 3)
    labels = torch.tensor([[0, 1, -100, 2], [-100, 0, 0, 1]])
    w = torch.tensor([0.5, 2.0, 3.0])
    keep = labels != -100
    per = F.cross_entropy(logits[keep], labels[keep], reduction="none")
    expected = (per * w[labels[keep]]).sum() / w[labels[keep]].sum()
    assert torch.allclose(token_loss(logits, labels, w), expected)
    assert token_loss(logits, torch.full_like(labels, -100)).item() == 0.0


def test_pytorch_default_init_is_deterministic_and_bounded():
    a, b = TokenClassifier(64, 3, num_layers=2, fc_hidden_size=32), TokenClassifier(64, 3, num_layers=2, fc_hidden_size=32)
    pytorch_default_init(a, "head.", seed=5)
    pytorch_default_init(b, "head.", seed=5)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    assert a.mlp.layer0.weight.abs().max() <= 1 / math.sqrt(64)
    assert a.mlp.layer2.bias.abs().max() <= 1 / math.sqrt(32)
    pytorch_default_init(b, "head.", seed=6)
    assert not torch.equal(a.mlp.layer0.weight, b.mlp.layer0.weight)
