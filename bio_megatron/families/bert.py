"""Original BERT (BioBERT, PubMedBERT, BioM-BERT, MiniLM): post-LN layers (LayerNorm after each residual add, an
embedding LayerNorm, no final LayerNorm), Hugging Face ``Bert*`` (``model_type: bert``), WordPiece vocabulary
(``model.transformer_block_type: post_ln``)."""

from __future__ import annotations

from bio_megatron.families.bert_layers import BertLikeFamily

BERT = BertLikeFamily("bert", ("bert",), "Bert", "post_ln")
