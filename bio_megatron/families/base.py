"""What an encoder family is: the one owner of everything that differs between Megatron BERT (pre-LN), original
BERT (post-LN), RoBERTa, ELECTRA and ALBERT. Export, loading, conversion and training ask the family through
:mod:`bio_megatron.families` (the registry) instead of re-deriving it from a tokenizer, an objective or a
``model_type`` string.

A family is a module-level object implementing :class:`Family` (structurally: no base class needed). Tensors
cross the family boundary as *full (TP1) megatron-core state dicts* on our side and as *Hugging Face state dicts*
on theirs; the model layout (TP/PP) is dist-checkpointing's business, never the family's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch import nn

    from bio_megatron.config.pretrain import ModelConfig

TokenizerKind = Literal["wordpiece", "bpe", "sentencepiece"]
# ``None`` is the pretraining model (MLM head, + NSP/SOP head when trained with one).
HFTask = Literal["ner", "qa", "re", "classify"] | None


@runtime_checkable
class Family(Protocol):
    name: str
    """Recorded as ``model.family`` in every checkpoint's config.yaml and in bio_megatron.json."""
    hf_model_types: tuple[str, ...]
    """``config.json`` ``model_type`` values read as this family; the first is the one written."""
    tokenizer_kind: TokenizerKind
    block_type: str
    """``model.transformer_block_type`` of this family's layers (``pre_ln`` / ``post_ln``): a config recording the
    family with the other order is refused (:func:`bio_megatron.families.family_of_model`)."""

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        """The plain transformers class that holds this family's model for ``task`` (None: pretraining)."""

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        """``ModelConfig`` fields for an HF ``config.json``; CheckpointError (one line, quoting the values) for
        anything the engine cannot compute exactly."""

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        """The transformers ``PretrainedConfig`` for our model config (``extra``: labels, problem_type, ...)."""

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *,
              binary_head: bool) -> dict[str, torch.Tensor]:
        """Full TP1 megatron-core encoder(+LM head) state -> HF state for ``hf_class(None)`` (padded vocabulary
        rows dropped)."""

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`to_hf` (vocabulary zero-padded to ``padded_vocab``)."""

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        """This rank's pretraining model (encoder + the family's pretraining heads) for ``vocab_size`` real
        tokens, weights NOT initialised (``training.pretrain.build_stage`` calls ``init_weights``)."""

    def task_encoder(self, m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                     post_process: bool) -> tuple[nn.Module | None, nn.Module]:
        """(embedding, encoder block) of this pipeline stage of a fine-tuning model (``loading.model.TaskModel``):
        the embedding (None unless ``pre_process``) is called as ``embedding(input_ids=, position_ids=,
        tokentype_ids=)`` and returns ``[s, b, h]``; the block as ``block(hidden_states=, attention_mask=)``, with
        ``set_input_tensor`` for pipeline stages. Parameter names must be the pretraining model's, so that its
        checkpoint's shards load into the task model directly."""

    def head_to_hf(self, task: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A fine-tuned model's ``head.*`` weights under the names of the plain class ``hf_class(task)`` (only for
        heads that class computes; other heads travel under our names in the remote-code classes)."""

    def head_from_hf(self, task: str, hsd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`head_to_hf` (KeyError names a missing weight)."""

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        """The special-token ids this family's HF config records and its tensor map depends on (RoBERTa's
        ``pad_token_id`` fixes its position offset), passed to :meth:`hf_config` and :meth:`to_hf` as keywords;
        empty when nothing depends on them."""

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        """What ``m`` has that this family's HF classes cannot compute (each naming the key and value); the
        exporter refuses in one line when there is any."""
