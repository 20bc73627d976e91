"""RoBERTa (bio-lm's RoBERTa-base/large): post-LN BERT layers under other names (``roberta.``,
``lm_head.{dense,layer_norm,decoder,bias}``), one token type, a byte-level BPE vocabulary, trained with
``model.objective: mlm``; Hugging Face ``Roberta*`` (``model_type: roberta``).

Positions: HF numbers the real tokens ``padding_idx + 1, padding_idx + 2, ...`` (pads get ``padding_idx``); our
model numbers them 0, 1, ... So import drops the first ``padding_idx + 1`` rows of HF's position table; row i of
ours is then row ``i + padding_idx + 1`` of theirs, the very row HF uses for the i-th real token of a right-padded
sequence: exact for every non-pad position. Export puts the rows back as zeros: HF only reads them for pad tokens,
whose outputs no real token attends to and no loss reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bio_megatron.families.base import HFTask, save_bpe_files
from bio_megatron.families.bert_layers import TASK_SUFFIX, BertLikeFamily, common_hf_problems, shape_fields
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from bio_megatron.config.pretrain import ModelConfig

# RoBERTa folders import as pretraining models (fine-tuning then uses their BPE tokenizer); fine-tuned
# RobertaFor* folders are written by export hf but not read back (their heads are not mapped on import).
IMPORT_CLASSES = ("RobertaModel", "RobertaForMaskedLM")
DEFAULT_PAD = 1  # RoBERTa's <pad> (<s> 0, <pad> 1, </s> 2), as vocab train --type bpe numbers them


def position_offset(cfg: dict) -> int:
    """Rows of an HF RoBERTa position table before the first real token's."""
    return int(cfg.get("pad_token_id", DEFAULT_PAD)) + 1


def roberta_to_bert(hsd: dict[str, torch.Tensor], padding_idx: int) -> dict[str, torch.Tensor]:
    """An HF ``RobertaModel`` / ``RobertaForMaskedLM`` state under ``BertForMaskedLM``'s names, positions shifted."""
    out = {}
    for k, v in hsd.items():
        if k.startswith("lm_head."):
            rest = k[len("lm_head."):]
            k = {"bias": "cls.predictions.bias", "decoder.weight": "cls.predictions.decoder.weight",
                 "decoder.bias": "cls.predictions.decoder.bias"}.get(rest, "cls.predictions.transform." + rest.replace(
                     "layer_norm.", "LayerNorm."))
        elif k.startswith("roberta."):
            k = "bert." + k[len("roberta."):]
        elif not k.startswith("bert."):  # a bare RobertaModel keeps no prefix
            k = "bert." + k
        out[k] = v
    pos = "bert.embeddings.position_embeddings.weight"
    if pos in out:
        out[pos] = out[pos][padding_idx + 1:]
    return out


def bert_to_roberta(hsd: dict[str, torch.Tensor], padding_idx: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`roberta_to_bert` (``RobertaForMaskedLM`` names; the dropped rows come back as zeros)."""
    import torch

    out = {}
    for k, v in hsd.items():
        if k.startswith("cls.predictions."):
            rest = k[len("cls.predictions."):]
            k = "lm_head." + ("bias" if rest == "bias" else rest.replace("transform.", "").replace("LayerNorm.",
                                                                                                 "layer_norm."))
        elif k.startswith("bert."):
            if k.startswith("bert.pooler."):
                continue  # RobertaForMaskedLM has no pooler
            k = "roberta." + k[len("bert."):]
        out[k] = v
    pos = "roberta.embeddings.position_embeddings.weight"
    out[pos] = torch.cat([out[pos].new_zeros(padding_idx + 1, out[pos].shape[1]), out[pos]])
    return out


class RobertaFamily(BertLikeFamily):
    """Post-LN BERT layers, RoBERTa's names and position offset, a byte-level BPE vocabulary."""

    def __init__(self):
        super().__init__("roberta", ("roberta",), "Roberta", "post_ln", tokenizer_kind="bpe")

    def save_tokenizer(self, out: Path, vocab_file: Path, lowercase: bool | None) -> None:
        """vocab.json + merges.txt (+ tokenizer.json): RobertaTokenizer's files; BPE does not lower-case."""
        save_bpe_files(out, vocab_file)

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        # RoBERTa has no NSP head: a binary head is refused by the exporter (export_problems), not renamed here
        return "RobertaForMaskedLM" if task is None else f"Roberta{TASK_SUFFIX[task]}"

    def export_problems(self, m: ModelConfig, task: HFTask, *, binary_head: bool = False) -> list[str]:
        """``Roberta*`` computes post-LN layers, one token type (fine-tuned models) and no NSP head."""
        problems = super().export_problems(m, task, binary_head=binary_head)
        if task is not None and m.num_tokentypes != 1:
            problems.append(f"num_tokentypes {m.num_tokentypes} (RoBERTa has one token type)")
        if binary_head:
            problems.append("bert_binary_head true (RoBERTa has no NSP head)")
        return problems

    def head_names(self, task: str) -> dict[str, str]:
        # RobertaClassificationHead: dense -> tanh -> out_proj on <s>, BERT's pooler + classifier under other names
        if task in ("re", "classify"):
            return {"classifier.dense": "head.mlp.layer0", "classifier.out_proj": "head.mlp.layer2"}
        return super().head_names(task)

    def hf_tokens(self, tokenizer) -> dict[str, int]:
        return {"pad_token_id": tokenizer.pad, "bos_token_id": tokenizer.cls, "eos_token_id": tokenizer.sep}

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        problems = common_hf_problems(cfg)
        arch = (cfg.get("architectures") or ["RobertaModel"])[0]
        if arch not in IMPORT_CLASSES:
            problems.append(f"architectures [{arch!r}] (RoBERTa imports as {' / '.join(IMPORT_CLASSES)} only)")
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        return shape_fields(cfg, self.block_type, position_offset(cfg))

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        """``RobertaConfig`` (positions offset back); ``extra`` may carry the tokenizer's ``pad_token_id``,
        ``bos_token_id`` (``<s>``) and ``eos_token_id`` (``</s>``)."""
        from transformers import RobertaConfig

        s = m.shape()
        pad, bos, eos = (extra.pop(k, d) for k, d in (("pad_token_id", DEFAULT_PAD), ("bos_token_id", 0),
                                                       ("eos_token_id", 2)))
        return RobertaConfig(
            vocab_size=vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
            num_attention_heads=s.num_attention_heads, intermediate_size=s.ffn_hidden_size, hidden_act="gelu",
            max_position_embeddings=m.max_position_embeddings + pad + 1, type_vocab_size=1,
            layer_norm_eps=m.layernorm_epsilon, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
            position_embedding_type="absolute", tie_word_embeddings=True, **extra)

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *, binary_head: bool,
              **tokens: int) -> dict[str, torch.Tensor]:
        """``tokens`` (:meth:`hf_tokens`): ``pad_token_id``, the tokenizer's ``<pad>``, fixes HF's position offset."""
        return bert_to_roberta(super().to_hf(sd, m, vocab_size, binary_head=binary_head),
                               tokens.get("pad_token_id", DEFAULT_PAD))

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        # HF's table holds padding_idx + 1 rows before ours (shape_from_hf took them off max_position_embeddings)
        rows = next((v.shape[0] for k, v in hsd.items() if k.endswith("embeddings.position_embeddings.weight")),
                    m.max_position_embeddings + DEFAULT_PAD + 1)
        return super().from_hf(roberta_to_bert(hsd, rows - m.max_position_embeddings - 1), m, padded_vocab,
                               binary_head=binary_head)


ROBERTA = RobertaFamily()
