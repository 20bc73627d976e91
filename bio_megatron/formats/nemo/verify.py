"""``import nemo --verify``: the archive's weights run by transformers vs the imported checkpoint.

NeMo itself is not installed here, so the reference is transformers' Megatron BERT holding the encoder
weights as :func:`~bio_megatron.formats.nemo.convert.read_nemo` read them from the archive (before our engine
saw them): a misread QKV layout, epsilon, token-type fold or vocabulary padding shows as a logit
difference. Pretraining archives compare MLM (and NSP) logits through ``MegatronBertForPreTraining``
(:func:`~bio_megatron.formats.verify.hf_reference`). Task archives compare the encoder's last hidden
states (``MegatronBertModel``) and the head's logits; their head is the paper's MLP, which transformers has no
class for, so the reference applies a copy of our head module loaded with the archive's head tensors to
transformers' hidden states (the comparison then proves the head weights and label order came across).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from bio_megatron.formats.state import ModelState
from bio_megatron.formats.verify import FP32_TOLERANCE, Forward, hf_reference, verify_import
from bio_megatron.utils.errors import CheckpointError


def _encoder_state(state: ModelState) -> dict[str, torch.Tensor]:
    """The archive's tensors as read (the import's token-type zeros included), in fp32."""
    return {k: v.float() for k, v in state.tensors.items()}


def _encoder_reference(state: ModelState) -> nn.Module:
    """transformers' ``MegatronBertModel`` (no pooler) holding the archive's encoder."""
    from transformers import MegatronBertModel

    from bio_megatron.models.hf_convert import hf_config, mcore_to_hf

    shape, m, vocab = state.shape, state.model, state.vocab_size
    cfg = hf_config(shape, vocab, m.max_position_embeddings, 2, m.layernorm_epsilon)
    hf = MegatronBertModel(cfg, add_pooling_layer=False).eval()
    missing, _ = hf.load_state_dict(mcore_to_hf(_encoder_state(state), shape, vocab, binary_head=False, prefix=""),
                                    strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    if missing:
        raise CheckpointError(f"{state.source}: cannot build the reference model: weights {missing[:4]} missing")
    return hf


def verify_nemo_import(state: ModelState, checkpoint: str | Path, tolerance: float | None = None) -> dict:
    """The report of :func:`~bio_megatron.formats.verify.verify_import` for an archive read by ``read_nemo``
    (``state``: before our engine saw it) and the checkpoint ``import nemo`` wrote from it."""
    from bio_megatron.parallel.distributed import single_process

    single_process()  # our side loads the checkpoint at TP1
    vocab = state.vocab_size
    tolerance = FP32_TOLERANCE if tolerance is None else tolerance
    label = f"{state.source} via transformers "
    if state.task is None:
        tensors = _encoder_state(state)
        if "lm_head.dense.weight" not in tensors:
            raise CheckpointError(f"{state.source}: --verify compares MLM logits; this archive has no LM head")
        m = state.model
        reference = hf_reference(tensors, m.shape(), vocab, binary_head=state.binary_head,
                                 layernorm_epsilon=m.layernorm_epsilon,
                                 max_position_embeddings=m.max_position_embeddings)
        return verify_import(reference, checkpoint, tolerance=tolerance, source=label + "MegatronBertForPreTraining")

    from bio_megatron.formats.finetuned import load_finetuned

    loaded = load_finetuned(checkpoint)
    head = loaded.model.head
    ref_head = copy.deepcopy(head).cpu()  # beside the transformers encoder (ours may be on a GPU)
    ref_head.load_state_dict({k[len("head."):]: v.float() for k, v in state.head.items()})
    encoder = _encoder_reference(state)

    def reference(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        return {"hidden": hidden, "logits": ref_head(hidden)}

    def ours(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        loaded.model.head = nn.Identity()  # TaskModel returns head(hidden): take the hidden states
        try:
            hidden = loaded.model(ids, mask, types)
        finally:
            loaded.model.head = head
        return {"hidden": hidden, "logits": head(hidden)}

    forward: Forward = ours
    return verify_import(reference, checkpoint, tolerance=tolerance, source=label + "MegatronBertModel + head",
                         ours=forward, vocab_size=vocab, max_positions=loaded.cfg.model.max_position_embeddings)
