"""RoPE's relative-position property in the whole ModernBERT model at TP2: shifting every position by the same
offset (rotary angles change, distances do not) leaves the MLM logits unchanged (the heads are split over the two
ranks, each rotating its own queries and keys with its layer's global or local base), while reversing the positions
(distances change) does not."""

from __future__ import annotations

from pathlib import Path

from harness import run_world

RECIPE = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain" / "tiny_modernbert.yaml"
SEQ, VOCAB = 24, 300


def _shifted_logits(tp: int) -> dict | None:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.families import family_of_model
    from bio_megatron.models.init import init_weights
    from bio_megatron.models.modernbert import RopeSelfAttention, attention_mask_for
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(tp, 1, seed=1)
    m = load_pretrain_config(RECIPE, ["model.tokenizer.vocab_file=unused", f"model.tensor_model_parallel_size={tp}",
                                      "model.local_attention=8"], tp).model
    model = family_of_model(m).build_pretraining_model(m, VOCAB, torch.float32).eval()
    init_weights(model, 3, 0.2, m.shape().num_layers)  # wide weights: attention far from uniform
    ids = torch.randint(5, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    attention = [mod for mod in model.modules() if isinstance(mod, RopeSelfAttention)]
    base = torch.arange(SEQ).expand(2, SEQ)

    def logits(positions):
        for mod in attention:  # what encode() sets for a packed batch; here every token's own position
            mod.positions = positions
        with torch.no_grad():
            out = model.encoder(hidden_states=model.embedding(input_ids=ids), attention_mask=attention_mask_for(mask))
            lg, _ = model.output_layer(model.lm_head(out), weight=model.embedding.word_embeddings.weight)
        return gather_from_tensor_model_parallel_region(lg)[..., :VOCAB]

    plain, shifted, reversed_ = logits(base), logits(base + 11), logits(base.flip(-1).contiguous())
    if ps.get_tensor_model_parallel_rank():
        return None
    return {"shift": float((plain - shifted).abs().max()), "reverse": float((plain - reversed_).abs().max()),
            "scale": float(plain.abs().max())}


def test_shifting_every_position_leaves_the_logits_unchanged_at_tp2():
    (res,) = [r for r in run_world(2, _shifted_logits, 2) if r is not None]
    assert res["scale"] > 0.5 and res["shift"] < 1e-4, res
    print(res)
    assert res["reverse"] > 1e-2, res  # positions do matter: the signed distances changed
