"""Megatron BERT, the engine's default family: pre-LN layers (LayerNorm before each sub-layer, a final LayerNorm),
Hugging Face ``MegatronBert*`` (``model_type: megatron-bert``; ``bio-megatron-bert`` is the remote-code task
classes ``export hf`` writes for heads transformers has no class for), WordPiece vocabulary."""

from __future__ import annotations

from bio_megatron.families.bert_layers import BertLikeFamily

REMOTE_MODEL_TYPE = "bio-megatron-bert"  # export hf's BioMegatronFor* classes (bio_megatron/formats/hf/modeling.py)
MEGATRON_BERT = BertLikeFamily("megatron_bert", ("megatron-bert", REMOTE_MODEL_TYPE), "MegatronBert", "pre_ln")
