"""What a one-stage encoder family built outside megatron-core's ``BertModel`` uses (ALBERT subclasses it;
ModernBERT, split into pipeline stages, is a megatron-core ``LanguageModule`` and shares :func:`on_device` only):
the attributes megatron-core's schedules and DDP read, a vocab-parallel MLM output layer tied to the word
embeddings with the padded vocabulary kept out of the softmax, the checkpoint tweak that lets that layer's bias
reshard across TP, and placing a built model on its device and dtype.

Pipeline parallelism is refused here (and first by the config): these models run every layer on one stage.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.models.bert import mask_padded_vocab
from bio_megatron.utils.errors import ConfigError

__all__ = ["TiedMLMModel", "on_device"]


class TiedMLMModel(MegatronModule):
    """Base of a pretraining model called as megatron-core's ``BertModel`` on one pipeline stage. A subclass
    builds ``self.embedding`` (a ``LanguageModelEmbedding``: its ``word_embeddings`` are the output weight) and
    calls :meth:`make_output_layer` with the width the MLM head hands it."""

    def __init__(self, config: TransformerConfig, m: ModelConfig, vocab_size: int, family: str):
        super().__init__(config=config)
        if m.pipeline_model_parallel_size != 1:
            raise ConfigError(f"model.family {family} needs model.pipeline_model_parallel_size=1")
        self.model_type = ModelType.encoder_or_decoder
        self.pre_process = self.post_process = True
        self.share_embeddings_and_output_weights = True
        self.true_vocab_size = vocab_size
        self.vocab_size = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)

    def make_output_layer(self, width: int, config: TransformerConfig) -> None:
        """The vocab-parallel decoder from ``width`` (its weight is the word embedding, passed at call time) with
        its own bias."""
        self.output_layer = tensor_parallel.ColumnParallelLinear(
            width, self.vocab_size, config=config, init_method=config.init_method, bias=True, skip_bias_add=False,
            gather_output=False, skip_weight_param_allocation=True)

    def set_input_tensor(self, input_tensor) -> None:
        """megatron-core's schedules call this with the previous stage's output: always None here (PP 1)."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        sd = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        # The vocabulary padding (a multiple of 128 x TP) changes with TP: the bias reshards as the word
        # embeddings do (megatron's LanguageModule marks its output layer the same way).
        sd[f"{prefix}output_layer.bias"].allow_shape_mismatch = True
        return sd

    def mlm_output(self, head_out: torch.Tensor, lm_labels: torch.Tensor | None) -> torch.Tensor:
        """[s, b, width] from the MLM head -> this rank's vocabulary slice of the logits [b, s, V/TP] (padded
        entries -inf), or with labels the per-token MLM loss [b, s]."""
        logits, _ = self.output_layer(head_out, weight=self.embedding.word_embeddings.weight)
        logits = mask_padded_vocab(logits, self.true_vocab_size)
        if lm_labels is None:
            return logits.transpose(0, 1).contiguous()
        loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), lm_labels.transpose(0, 1).contiguous())
        return loss.transpose(0, 1).contiguous()
