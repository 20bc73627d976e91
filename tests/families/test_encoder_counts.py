"""Each family's ``encoder_parameter_count`` (what ``finetune --dry-run`` prints as ``parameters_encoder``) equals the
parameters of the encoder a fine-tuning model is built with (``families.task.build_task_model`` with a head that has
none), for every tiny pretraining recipe: Megatron BERT, post-LN BERT, RoBERTa, ELECTRA's discriminator, ALBERT's
factorised embedding and shared layer, ModernBERT. The dry run used BERT's formula for all of them."""

from __future__ import annotations

from pathlib import Path

from harness import run_world

RECIPES = Path(__file__).resolve().parents[2] / "nemo_configs" / "pretrain"
NAMES = ("tiny", "tiny_post_ln", "tiny_roberta", "tiny_electra", "tiny_albert", "tiny_modernbert")


def _counted_and_built(vocab: int) -> dict[str, tuple[int, int]]:
    import torch

    from bio_megatron.config.pretrain import load_pretrain_config
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families import family_of_model
    from bio_megatron.families.task import build_task_model
    from bio_megatron.parallel.distributed import init_distributed, init_model_parallel

    init_distributed()
    init_model_parallel(1, 1, seed=1)
    out = {}
    for name in NAMES:
        m = load_pretrain_config(RECIPES / f"{name}.yaml", ["model.tokenizer.vocab_file=unused"], 1).model
        padded = padded_vocab_size(vocab, m.make_vocab_size_divisible_by, 1)
        model = build_task_model(m, padded, torch.nn.Identity(), torch.float32, seed=0, pre_process=True,
                                 post_process=True)
        out[name] = (family_of_model(m).encoder_parameter_count(m, padded), sum(p.numel() for p in model.parameters()))
    return out


def test_encoder_parameter_count_is_the_built_task_encoders():
    (got,) = run_world(1, _counted_and_built, 1000)
    assert {name: counted for name, (counted, _) in got.items()} == {name: built for name, (_, built) in got.items()}
