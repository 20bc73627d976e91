"""``import ... --verify``: the source model and the imported checkpoint on one fixed batch, compared.

Conversions go wrong silently (a QKV layout, an epsilon, a ReLU read as GELU): the only proof an import is
right is the numbers. The source is run by an implementation that is not ours wherever one exists
(transformers' ``MegatronBertForPreTraining``, see :func:`hf_reference`), the imported checkpoint by our
engine at TP1, on a fixed batch with padding (rows of full, 2/3 and 1/3 length, two token types). Outputs
are compared at the valid (non-padded) positions over the real vocabulary; the result is a JSON-able dict
whose ``verified`` is false when the largest absolute difference exceeds the tolerance (the CLI exits 1).

How another importer uses it (``import hf`` / ``import nemo``)::

    from bio_megatron.formats.verify import verify_import, hf_reference
    reference = hf_reference(full_tp1_state, shape, vocab_size, binary_head=..., layernorm_epsilon=...)
    #  ... or any callable (input_ids, attention_mask, token_type_ids) -> {"mlm": [B,S,V], "nsp": [B,2]}
    report = verify_import(reference, written_checkpoint, source="nemo model_weights.ckpt via transformers")
    # report["verified"], report["max_abs_diff"]; for a fine-tuned checkpoint pass ours=<callable> returning
    # the same keys as the reference (e.g. {"logits": ...} of the task head).

Keys that only one side returns are ignored; at least one key must be shared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.utils.errors import CheckpointError

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
FP32_TOLERANCE = 1e-4  # fp32 logits of the same weights through two implementations differ by ~1e-6


def fixed_batch(vocab_size: int, max_positions: int, seq: int = 24, seed: int = 7, num_tokentypes: int = 2):
    """(input_ids, attention_mask, token_type_ids): 3 rows, two of them padded, token types 0 then 1 (all 0 for
    a model with one token type, such as RoBERTa)."""
    seq = min(seq, max_positions)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, vocab_size - 1), vocab_size, (3, seq), generator=g)
    lens = torch.tensor([seq, max(2, 2 * seq // 3), max(2, seq // 3)])
    mask = (torch.arange(seq)[None] < lens[:, None]).long()
    types = (torch.arange(seq)[None] >= (lens[:, None] // 2)).long() * mask * int(num_tokentypes > 1)
    ids = ids * mask  # [PAD] (id 0) where padded, as a tokenizer gives it
    return ids, mask, types


def hf_reference(state: dict[str, torch.Tensor], shape: ModelShape, vocab_size: int, *, binary_head: bool,
                 layernorm_epsilon: float, max_position_embeddings: int, num_tokentypes: int = 2) -> Forward:
    """transformers' ``MegatronBertForPreTraining`` holding ``state`` (our full TP1 names: what a converter
    produced from the source, before our engine saw it)."""
    from transformers import MegatronBertForPreTraining

    from bio_megatron.models.hf_convert import hf_config, mcore_to_hf

    cfg = hf_config(shape, vocab_size, max_position_embeddings, num_tokentypes, layernorm_epsilon)
    hf = MegatronBertForPreTraining(cfg).eval()
    weights = mcore_to_hf(state, shape, vocab_size, binary_head=binary_head)
    missing, _ = hf.load_state_dict(weights, strict=False)
    # the NSP head is absent from files trained without it; everything else must be there
    missing = [k for k in missing if not k.startswith(("cls.seq_relationship", "bert.pooler"))]
    if missing:
        raise CheckpointError(f"cannot build the reference model: weights {missing[:4]} missing")

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        return {"mlm": out.prediction_logits, **({"nsp": out.seq_relationship_logits} if binary_head else {})}

    return forward


def load_pretraining(checkpoint: str | Path):
    """Our pretraining checkpoint (any saved layout, either block type, WordPiece or byte-level BPE vocabulary)
    as a TP1 model in eval mode: (model, ModelConfig, tokenizer). Unlike ``export megatron-lm`` / ``nemo`` it admits
    every family ``import hf`` writes: verification of a post-LN BERT or a RoBERTa import reads it back here."""
    from bio_megatron.formats.ours import read_pretraining
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.formats.source import resolve_source

    single_process()
    src = resolve_source(checkpoint)
    if src.kind != "checkpoint" or src.task is not None:
        raise CheckpointError(f"{checkpoint}: not a pretraining checkpoint of ours (verify reads one back)")
    return read_pretraining(src)


def _checkpoint_model(checkpoint: str | Path) -> tuple[Forward, int, int, int]:
    """(forward, vocab size, max positions, token types) of our pretraining checkpoint at TP1."""
    model, m, tok = load_pretraining(checkpoint)

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        out = model(ids, mask, tokentype_ids=types)
        lm, nsp = out if isinstance(out, tuple) else (out, None)
        return {"mlm": lm, **({"nsp": nsp} if nsp is not None else {})}

    return forward, tok.vocab_size, m.max_position_embeddings, m.num_tokentypes


def checkpoint_forward(checkpoint: str | Path) -> tuple[Forward, int, int]:
    """Our pretraining checkpoint (any saved layout) at TP1: (forward, vocab size, max positions)."""
    return _checkpoint_model(checkpoint)[:3]


def compare(reference: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], mask: torch.Tensor,
            vocab_size: int) -> dict[str, float]:
    """Max |difference| per shared output: token outputs at valid positions, real vocabulary only."""
    diffs = {}
    for key in sorted(set(reference) & set(ours)):
        a, b = reference[key].detach().float(), ours[key].detach().float()
        if a.dim() == 3:  # [B, S, V]: padded positions and vocabulary padding carry no meaning
            a, b = a[mask.bool()][..., :vocab_size], b[mask.bool()][..., :vocab_size]
        if a.shape != b.shape:
            raise CheckpointError(f"verify: output {key!r} has shape {tuple(a.shape)} in the source and "
                                  f"{tuple(b.shape)} in the imported checkpoint")
        diffs[key] = float((a - b).abs().max()) if a.numel() else 0.0
    if not diffs:
        raise CheckpointError(f"verify: no output to compare (source gives {sorted(reference)}, the imported "
                              f"checkpoint {sorted(ours)})")
    return diffs


@torch.no_grad()
def verify_import(reference: Forward, checkpoint: str | Path, *, tolerance: float = FP32_TOLERANCE,
                  source: str = "source", ours: Forward | None = None, vocab_size: int | None = None,
                  max_positions: int | None = None, seq: int = 24, num_tokentypes: int = 2) -> dict:
    """Run ``reference`` and the imported ``checkpoint`` (or ``ours``) on :func:`fixed_batch`; returns
    ``{"verified", "max_abs_diff", "outputs": {name: diff}, "tolerance", "reference", "batch"}``.
    ``vocab_size`` / ``max_positions`` (and ``num_tokentypes``) are required only with ``ours``."""
    if ours is None:
        ours, vocab_size, max_positions, num_tokentypes = _checkpoint_model(checkpoint)
    if vocab_size is None or max_positions is None:
        raise ValueError("verify_import: pass vocab_size and max_positions together with ours")
    ids, mask, types = fixed_batch(vocab_size, max_positions, seq, num_tokentypes=num_tokentypes)
    # the reference (transformers, on the CPU) and ours (on this rank's GPU where there is one: models/init.on_device)
    # each get the batch where their weights are; the outputs are compared on the CPU
    from bio_megatron.models.init import rank_device

    here = rank_device()
    mine = {k: v.cpu() for k, v in ours(ids.to(here), mask.to(here), types.to(here)).items()}
    diffs = compare(reference(ids, mask, types), mine, mask, vocab_size)
    worst = max(diffs.values())
    return {"verified": bool(worst <= tolerance), "max_abs_diff": worst, "outputs": diffs, "tolerance": tolerance,
            "reference": source, "checkpoint": str(checkpoint),
            "batch": {"rows": int(ids.shape[0]), "seq": int(ids.shape[1]), "lengths": mask.sum(1).tolist()}}
