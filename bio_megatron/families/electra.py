"""ELECTRA (BioELECTRA, BioM-ELECTRA): a post-LN BERT discriminator and a narrower generator sharing one embedding
(``model.objective: electra``, :mod:`bio_megatron.models.electra`); Hugging Face ``ElectraForPreTraining``
(discriminator) + ``ElectraForMaskedLM`` (generator), ``model_type: electra``, WordPiece vocabulary.

Both HF encoders are post-LN BERT under other names (``electra.`` for ``bert.``), so the per-layer mapping is
:mod:`bio_megatron.models.hf_convert`'s. What is ELECTRA's own:

- one embedding (word, position, token type, LayerNorm) shared by both networks, as the paper trains it: HF keeps
  two copies (``electra.embeddings.*`` in each folder), which must be equal on import and are written twice on
  export;
- the generator is narrower (hidden G < H) and reads the embedding through ``electra.embeddings_project``
  (E -> G; absent when G == E); its MLM head is ``generator_predictions.{dense,LayerNorm}`` (G -> E) and
  ``generator_lm_head`` (tied to the word embeddings; its bias);
- the discriminator's head is ``discriminator_predictions.{dense,dense_prediction}`` (H -> H -> 1, GELU).

A model fine-tuned from the discriminator is a post-LN BERT encoder + our head: it exports to the ``Bert*`` task
classes (``hf_class(task)``), which compute exactly that.

This module imports neither transformers nor megatron at import time: ``formats.source.resolve_source`` reads HF
folders through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from bio_megatron.config.sizes import ModelShape
from bio_megatron.families.base import HFTask
from bio_megatron.families.bert import BERT
from bio_megatron.families.bert_layers import BertLikeFamily, common_hf_problems, shape_fields
from bio_megatron.models.hf_convert import untf  # TF-converted LayerNorm gamma/beta, as for BERT
from bio_megatron.utils.errors import CheckpointError

if TYPE_CHECKING:
    from megatron.core.transformer.module import MegatronModule

    from bio_megatron.config.pretrain import ModelConfig

MODEL_TYPE = "electra"
DISCRIMINATOR_CLASSES = ("ElectraForPreTraining", "ElectraModel")
GENERATOR_CLASS = "ElectraForMaskedLM"
_SHARED = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
           "LayerNorm.weight", "LayerNorm.bias")
# (ours, HF's) outside the encoders; generator entries are relative to ``generator.``.
_DISC_HEAD = (("discriminator_head.dense", "discriminator_predictions.dense"),
              ("discriminator_head.dense_prediction", "discriminator_predictions.dense_prediction"))
_GEN_HEAD = (("embeddings_project", "electra.embeddings_project"), ("lm_head.dense", "generator_predictions.dense"),
             ("lm_head.layer_norm", "generator_predictions.LayerNorm"))


def electra_problems(cfg: dict) -> list[str]:
    """What an HF ELECTRA discriminator ``config.json`` has that the shared-embedding model cannot hold
    (``shape_from_hf`` adds them to the checks every BERT-shaped family makes: activation, positions, decoder)."""
    problems = []
    emb, hidden = cfg.get("embedding_size", cfg.get("hidden_size")), cfg.get("hidden_size")
    if emb != hidden:  # ELECTRA-small: a projected embedding in the discriminator too
        problems.append(f"embedding_size ({emb}) != hidden_size ({hidden}): the discriminator must read the shared "
                        "embedding directly (ELECTRA-small style projected embeddings are not supported)")
    arch = (cfg.get("architectures") or ["ElectraModel"])[0]
    if arch == GENERATOR_CLASS:
        problems.append(f"architectures [{arch!r}] is an ELECTRA generator: pass it with --generator and the "
                        "discriminator with --model (fine-tuning starts from the discriminator)")
    elif arch not in DISCRIMINATOR_CLASSES:
        problems.append(f"architectures [{arch!r}] (ELECTRA imports as {' / '.join(DISCRIMINATOR_CLASSES)}, the "
                        "discriminator)")
    return problems


def generator_problems(gen: dict, disc: dict, expected: ModelShape) -> list[str]:
    """Why an HF generator ``config.json`` does not fit beside ``disc`` in one model whose generator has the
    ``expected`` shape (derived from the fraction G/H the way the model derives it)."""
    problems = []
    arch = (gen.get("architectures") or [GENERATOR_CLASS])[0]
    if gen.get("model_type") != MODEL_TYPE or arch != GENERATOR_CLASS:
        problems.append(f"model_type {gen.get('model_type')!r} / architectures [{arch!r}], expected "
                        f"{MODEL_TYPE!r} / {GENERATOR_CLASS!r}")
    for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        if gen.get(key, want) != want:
            problems.append(f"{key} {gen[key]!r} (only {want!r} is supported)")
    for key in ("is_decoder", "add_cross_attention"):
        if gen.get(key):
            problems.append(f"{key} true (an encoder is expected)")
    if gen.get("embedding_size", gen.get("hidden_size")) != disc["hidden_size"]:
        problems.append(f"embedding_size ({gen.get('embedding_size')}) != the discriminator's hidden_size "
                        f"({disc['hidden_size']}): the embedding must be the shared one")
    for key in ("vocab_size", "max_position_embeddings", "type_vocab_size"):
        if gen.get(key) != disc.get(key):
            problems.append(f"{key} {gen.get(key)!r} != the discriminator's {disc.get(key)!r}")
    if gen.get("layer_norm_eps", 1e-12) != disc.get("layer_norm_eps", 1e-12):
        problems.append(f"layer_norm_eps {gen.get('layer_norm_eps', 1e-12)!r} != the discriminator's "
                        f"{disc.get('layer_norm_eps', 1e-12)!r} (one epsilon for the whole model)")
    got = (gen.get("num_hidden_layers"), gen.get("hidden_size"), gen.get("num_attention_heads"),
           gen.get("intermediate_size"))
    want = (expected.num_layers, expected.hidden_size, expected.num_attention_heads, expected.ffn_hidden_size)
    if got != want:
        problems.append(f"(layers, hidden, heads, ffn) {got} != {want}, what the model builds for "
                        f"generator_hidden_fraction {gen.get('hidden_size')}/{disc['hidden_size']}")
    return problems


def check_shared_embeddings(disc: dict[str, torch.Tensor], gen: dict[str, torch.Tensor], where: str) -> None:
    """The generator's embedding tensors must be the discriminator's (ELECTRA ties them): CheckpointError
    naming the first tensor that differs and by how much."""
    for name in _SHARED:
        a, b = disc.get(f"bert.embeddings.{name}"), gen.get(f"bert.embeddings.{name}")
        if a is None or b is None:
            raise CheckpointError(f"{where}: embeddings.{name} is missing")
        if a.shape != b.shape or not torch.equal(a, b):
            if a.shape != b.shape:
                diff = f"shape {tuple(b.shape)} vs {tuple(a.shape)}"
            else:
                diff = f"max abs difference {float((a.float() - b.float()).abs().max()):.3g}"
            raise CheckpointError(f"{where}: the generator's embeddings.{name} differs from the discriminator's "
                                  f"({diff}); ELECTRA shares one embedding, the model cannot hold two")


def electra_to_bert(hsd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF ELECTRA state's encoder under ``BertModel``'s names with the ``bert.`` prefix (heads and the
    generator's ``embeddings_project`` dropped): what :func:`bio_megatron.models.hf_convert.hf_to_mcore` reads."""
    out = {}
    for k, v in hsd.items():
        if k.startswith(("discriminator_predictions.", "generator_predictions.", "generator_lm_head.")):
            continue
        k = untf(k[len("electra."):] if k.startswith("electra.") else k)  # a bare ElectraModel has no prefix
        if k.startswith(("embeddings.", "encoder.")):
            out["bert." + k] = v
    return out


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    extra = rows - t.shape[0]
    return torch.cat([t, t.new_zeros((extra,) + tuple(t.shape[1:]))]) if extra > 0 else t


def electra_hf_to_mcore(disc: dict[str, torch.Tensor], gen: dict[str, torch.Tensor] | None, shape: ModelShape,
                        gen_shape: ModelShape, padded_vocab: int, where: str) -> dict[str, torch.Tensor]:
    """HF discriminator (+ generator) states -> our full TP1 ELECTRA state. Without ``gen`` only the shared
    embedding, the discriminator and its head are returned (the caller keeps a fresh generator)."""
    from bio_megatron.models.hf_convert import hf_to_mcore

    disc = {untf(k): v for k, v in disc.items()}
    gen = None if gen is None else {untf(k): v for k, v in gen.items()}
    full = hf_to_mcore(electra_to_bert(disc), shape, padded_vocab, binary_head=False)
    for ours, theirs in _DISC_HEAD:
        for p in ("weight", "bias"):
            if f"{theirs}.{p}" in disc:  # a bare ElectraModel has no head
                full[f"{ours}.{p}"] = disc[f"{theirs}.{p}"].detach().clone()
    if gen is None:
        return full
    check_shared_embeddings(electra_to_bert(disc), electra_to_bert(gen), where)
    word = gen["electra.embeddings.word_embeddings.weight"]
    tied = gen.get("generator_lm_head.weight")
    if tied is not None and not torch.equal(tied, word):
        raise CheckpointError(f"{where}: generator_lm_head.weight differs from the word embeddings (untied output "
                              "embeddings): not supported, the model ties them")
    enc = hf_to_mcore(electra_to_bert(gen), gen_shape, padded_vocab, binary_head=False)
    full.update({f"generator.{k}": v for k, v in enc.items() if k.startswith("encoder.")})
    for ours, theirs in _GEN_HEAD:
        for p in ("weight", "bias"):
            if f"{theirs}.{p}" in gen:  # embeddings_project only when G != E
                full[f"generator.{ours}.{p}"] = gen[f"{theirs}.{p}"].detach().clone()
    full["generator.output_layer.bias"] = _pad(gen["generator_lm_head.bias"], padded_vocab).detach().clone()
    return full


def _electra_names(hsd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"electra." + k[len("bert."):]: v for k, v in hsd.items()}


def discriminator_to_hf(sd: dict[str, torch.Tensor], shape: ModelShape, vocab_size: int) -> dict[str, torch.Tensor]:
    """The shared embedding, the discriminator and (when ``sd`` has it) its head as an ``ElectraForPreTraining``
    state, the vocabulary padding trimmed."""
    from bio_megatron.models.hf_convert import mcore_to_hf

    ours = {k: v for k, v in sd.items() if k.startswith(("embedding.", "encoder."))}
    disc = _electra_names(mcore_to_hf(ours, shape, vocab_size, binary_head=False))
    for mine, theirs in _DISC_HEAD:
        disc.update({f"{theirs}.{p}": sd[f"{mine}.{p}"].detach().clone() for p in ("weight", "bias")
                     if f"{mine}.{p}" in sd})
    return disc


def electra_mcore_to_hf(sd: dict[str, torch.Tensor], shape: ModelShape, gen_shape: ModelShape,
                        vocab_size: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Our full TP1 ELECTRA state -> (``ElectraForPreTraining`` state, ``ElectraForMaskedLM`` state), the
    vocabulary padding trimmed; the generator's ``generator_lm_head.weight`` is left to the tie."""
    from bio_megatron.models.hf_convert import mcore_to_hf

    electra = _electra_names
    shared = {k: v for k, v in sd.items() if k.startswith("embedding.")}
    disc = discriminator_to_hf(sd, shape, vocab_size)
    gen = electra(mcore_to_hf({**shared, **{k[len("generator."):]: v for k, v in sd.items()
                                            if k.startswith("generator.encoder.")}}, gen_shape, vocab_size,
                              binary_head=False))
    for ours, theirs in _GEN_HEAD:
        gen.update({f"{theirs}.{p}": sd[f"generator.{ours}.{p}"].detach().clone() for p in ("weight", "bias")
                    if f"generator.{ours}.{p}" in sd})
    gen["generator_lm_head.bias"] = sd["generator.output_layer.bias"][:vocab_size].detach().clone()
    return disc, gen


def electra_configs(shape: ModelShape, gen_shape: ModelShape, vocab_size: int, max_position_embeddings: int,
                    num_tokentypes: int, layernorm_epsilon: float):
    """(discriminator ``ElectraConfig`` for ``ElectraForPreTraining``, generator one for ``ElectraForMaskedLM``):
    embedding_size = H in both, exact GELU, absolute positions."""
    from transformers import ElectraConfig

    common = dict(vocab_size=vocab_size, embedding_size=shape.hidden_size, hidden_act="gelu",
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=max_position_embeddings, type_vocab_size=num_tokentypes,
                  layer_norm_eps=layernorm_epsilon, position_embedding_type="absolute", tie_word_embeddings=True)

    def cfg(s: ModelShape, arch: str):
        return ElectraConfig(hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
                             num_attention_heads=s.num_attention_heads, intermediate_size=s.ffn_hidden_size,
                             architectures=[arch], **common)

    return cfg(shape, DISCRIMINATOR_CLASSES[0]), cfg(gen_shape, GENERATOR_CLASS)


class ElectraFamily(BertLikeFamily):
    """The discriminator is what the engine fine-tunes and HF loads as the model; the generator travels beside it
    (``formats/hf/electra.py`` writes and reads the two folders)."""

    def __init__(self):
        super().__init__("electra", (MODEL_TYPE,), "Electra", "post_ln")

    def parameter_count(self, m: ModelConfig, padded_vocab: int) -> int:
        """Generator + discriminator, the shared embedding once (``config.family_keys.electra_parameter_count``)."""
        from bio_megatron.config.family_keys import electra_parameter_count

        return electra_parameter_count(m, padded_vocab)

    def hf_class(self, task: HFTask, *, binary_head: bool = False) -> str:
        # fine-tuned: a post-LN BERT encoder + our head, which transformers' Bert* task classes compute
        return DISCRIMINATOR_CLASSES[0] if task is None else BERT.hf_class(task)

    def shape_from_hf(self, cfg: dict, where: str) -> dict:
        problems = common_hf_problems(cfg) + electra_problems(cfg)
        if problems:
            raise CheckpointError(f"{where}: cannot be reproduced exactly: " + "; ".join(problems))
        return shape_fields(cfg, self.block_type)

    def hf_config(self, m: ModelConfig, vocab_size: int, **extra):
        """The discriminator's ``ElectraConfig`` (the generator's: :func:`electra_configs`); a model fine-tuned
        from the discriminator (no ELECTRA objective) is BERT's."""
        from bio_megatron.config.family_keys import electra_shapes

        if m.objective != "electra":
            return BERT.hf_config(m, vocab_size, **extra)

        disc, _ = electra_configs(m.shape(), electra_shapes(m), vocab_size, m.max_position_embeddings,
                                  m.num_tokentypes, m.layernorm_epsilon)
        for k, v in extra.items():
            setattr(disc, k, v)
        return disc

    def to_hf(self, sd: dict[str, torch.Tensor], m: ModelConfig, vocab_size: int, *,
              binary_head: bool, **tokens: int) -> dict[str, torch.Tensor]:
        if m.objective != "electra":  # fine-tuned from the discriminator: a post-LN BERT encoder (+ head)
            return BERT.to_hf(sd, m, vocab_size, binary_head=binary_head)
        return discriminator_to_hf(sd, m.shape(), vocab_size)

    def from_hf(self, hsd: dict[str, torch.Tensor], m: ModelConfig, padded_vocab: int, *,
                binary_head: bool) -> dict[str, torch.Tensor]:
        return electra_hf_to_mcore(hsd, None, m.shape(), m.shape(), padded_vocab, "")

    def build_pretraining_model(self, m: ModelConfig, vocab_size: int, dtype: torch.dtype) -> MegatronModule:
        from bio_megatron.models.electra import build_electra_model

        return build_electra_model(m, vocab_size, dtype)


ELECTRA = ElectraFamily()
