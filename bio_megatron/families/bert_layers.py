"""What the BERT-shaped families (Megatron BERT pre-LN, BERT post-LN, RoBERTa, ELECTRA's discriminator) share:
one megatron-core encoder (``LanguageModelEmbedding`` + ``TransformerBlock``), the same per-layer tensor map
(:mod:`bio_megatron.models.hf_convert`), and the same refusals of HF configs the engine cannot compute exactly.

:class:`BertLikeFamily` implements the whole :class:`~bio_megatron.families.base.Family` protocol for a family whose
HF model is ``<prefix>For*`` over a ``bert.`` encoder; a family module makes one instance (or a subclass where its
names differ: RoBERTa, ELECTRA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bio_megatron.families.base import COMMON_SHAPE_KEYS, FamilyDefaults, HFTask, TokenizerKind
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch import nn

    from bio_megatron.config.pretrain import ModelConfig

# The plain task classes' heads, HF module -> ours, shared by every BERT-shaped family (RoBERTa renames RE's).
PLAIN_HEAD_NAMES = {"ner": {"classifier": "head.mlp.layer0"}, "qa": {"qa_outputs": "head.mlp.layer0"},
                    "re": {"bert.pooler.dense": "head.mlp.layer0", "classifier": "head.mlp.layer2"},
                    "classify": {"bert.pooler.dense": "head.mlp.layer0", "classifier": "head.mlp.layer2"}}
# task -> the suffix of transformers' class for it (RE and BLURB classification: one sequence classifier).
TASK_SUFFIX = {"ner": "ForTokenClassification", "qa": "ForQuestionAnswering", "re": "ForSequenceClassification",
               "classify": "ForSequenceClassification"}


def common_hf_problems(cfg: dict) -> list[str]:
    """What any BERT-shaped HF ``config.json`` can hold that megatron-core's encoder cannot compute exactly."""
    problems = []
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":  # megatron-core's BertLMHead hard-codes exact GELU; gelu_new / relu would differ
        problems.append(f"hidden_act {act!r} (only exact 'gelu' is supported)")
    pos = cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        problems.append(f"position_embedding_type {pos!r} (only 'absolute' is supported)")
    for key in ("is_decoder", "add_cross_attention"):
        if cfg.get(key):
            problems.append(f"{key} true (an encoder is expected)")
    if cfg.get("hidden_size", 0) % max(cfg.get("num_attention_heads", 1), 1):
        problems.append(f"hidden_size ({cfg.get('hidden_size')}) not divisible by num_attention_heads "
                        f"({cfg.get('num_attention_heads')})")
    return problems


def shape_fields(cfg: dict, block_type: str, position_offset: int = 0) -> dict:
    """``ModelConfig`` fields of a checked BERT-shaped ``config.json``."""
    return {"num_layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"],
            "num_attention_heads": cfg["num_attention_heads"], "ffn_hidden_size": cfg["intermediate_size"],
            "max_position_embeddings": cfg["max_position_embeddings"] - position_offset,
            "num_tokentypes": cfg["type_vocab_size"], "layernorm_epsilon": cfg.get("layer_norm_eps", 1e-12),
            "transformer_block_type": block_type}


def bert_task_encoder(m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                      post_process: bool) -> tuple[nn.Module | None, nn.Module]:
    """megatron-core's BERT embedding and transformer block for ``m``'s layer order, under ``BertModel``'s
    parameter names (``embedding.*``, ``encoder.layers.*``, ``encoder.final_layernorm.*``)."""
    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from bio_megatron.models.bert import layer_spec
    from bio_megatron.models.post_ln import add_embedding_layernorm, is_post_ln

    spec = layer_spec(m)
    post_ln = is_post_ln(spec)
    embedding = None
    if pre_process:
        embedding = LanguageModelEmbedding(config=config, vocab_size=padded_vocab,
                                           max_sequence_length=m.max_position_embeddings,
                                           position_embedding_type="learned_absolute",
                                           num_tokentypes=m.num_tokentypes)
        if post_ln:  # original BERT: LayerNorm on the embedding sum, none after the last layer
            add_embedding_layernorm(embedding)
    encoder = TransformerBlock(config=config, spec=spec, pre_process=pre_process, post_process=post_process,
                               post_layer_norm=not post_ln)
    return embedding, encoder


class BertLikeFamily(FamilyDefaults):
    """A family whose HF classes are ``<class_prefix>For*`` over a ``bert.`` encoder (``MegatronBert``, ``Bert``).
    Its tokenizer files and parameter count are :class:`~bio_megatron.families.base.FamilyDefaults`' (any
    tokenizer file by its kind; megatron-core ``BertModel``'s count, which the post-LN order does not change)."""

    shape_keys = COMMON_SHAPE_KEYS

    def __init__(self, name: str, hf_model_types: tuple[str, ...], class_prefix: str, block_type: str,
                 tokenizer_kind: TokenizerKind = "wordpiece"):
        self.name = name
        self.hf_model_types = hf_model_types
        self.tokenizer_kind = tokenizer_kind
        self.class_prefix = class_prefix
        self.block_type = block_type
        """``model.transformer_block_type`` of this family's layers (pre_ln / post_ln)."""

    def __repr__(self) -> str:
        return f"<family {self.name}>"

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        if task is None:
            return f"{self.class_prefix}{'ForPreTraining' if binary_head else 'ForMaskedLM'}"
        return f"{self.class_prefix}{TASK_SUFFIX[task]}"

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        problems = common_hf_problems(cfg)
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        return shape_fields(cfg, self.block_type)

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        from bio_megatron.models.hf_convert import hf_config

        return hf_config(m.shape(), vocab_size, m.max_position_embeddings, m.num_tokentypes, m.layernorm_epsilon,
                         block_type=self.block_type, **extra)

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *, binary_head: bool,
              **tokens: int) -> dict[str, torch.Tensor]:
        """``tokens``: :meth:`hf_tokens` (nothing here depends on them)."""
        from bio_megatron.models.hf_convert import mcore_to_hf

        return mcore_to_hf(sd, m.shape(), vocab_size, binary_head=binary_head)

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        from bio_megatron.models.hf_convert import hf_to_mcore

        prefix = "bert." if any(k.startswith("bert.") for k in hsd) else ""  # a bare BertModel has none
        return hf_to_mcore(hsd, m.shape(), padded_vocab, binary_head=binary_head, prefix=prefix)

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        from bio_megatron.models.bert import build_model

        return build_model(m, vocab_size, dtype)

    def task_encoder(self, m: ModelConfig, padded_vocab: int, config: TransformerConfig, pre_process: bool,
                     post_process: bool) -> tuple[nn.Module | None, nn.Module]:
        return bert_task_encoder(m, padded_vocab, config, pre_process, post_process)

    def head_to_hf(self, task: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f"{theirs}.{p}": sd[f"{ours}.{p}"].detach().clone().contiguous()
                for theirs, ours in self.head_names(task).items() for p in ("weight", "bias")}

    def head_from_hf(self, task: str, hsd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f"{ours}.{p}": hsd[f"{theirs}.{p}"] for theirs, ours in self.head_names(task).items()
                for p in ("weight", "bias")}

    def head_names(self, task: str) -> dict[str, str]:
        """HF module -> ours of the plain task class's head (RE and classify: BERT's tanh pooler + classifier)."""
        return PLAIN_HEAD_NAMES[task]

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        return {}

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        if m.transformer_block_type != self.block_type:
            return [f"transformer_block_type {m.transformer_block_type} (the {self.name} family's layers are "
                    f"{self.block_type})"]
        return []
