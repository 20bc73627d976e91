"""``import hf`` / ``export hf`` for ELECTRA: HF discriminator (+ generator) folders <-> one ELECTRA checkpoint of
ours (``model.objective: electra``, :mod:`bio_megatron.models.electra`).

- **import**: ``--model`` is the discriminator (``ElectraForPreTraining``, or a bare ``ElectraModel``),
  ``--generator`` its ``ElectraForMaskedLM``. The generator's width gives ``model.generator_hidden_fraction``
  (G / H); its depth, heads and FFN must be what the model derives from it (:func:`config.family_keys.electra_shapes`)
  and its embedding tensors must be the discriminator's (ELECTRA shares them). Without ``--generator``
  (BioELECTRA publishes discriminators only) the checkpoint gets a freshly initialised generator of the
  paper's fraction (1/3 as ELECTRA-base, 1/4 from width 1024 as ELECTRA-large), with a warning: fine-tuning reads only the discriminator, and
  continued pretraining trains the generator from scratch alongside it, as ELECTRA itself does at step 0.
  A bare ``ElectraModel`` likewise gets a fresh discriminator head.
- **export**: ``OUT/discriminator/`` (``ElectraForPreTraining``) and ``OUT/generator/`` (``ElectraForMaskedLM``),
  each a complete folder (config.json, model.safetensors, WordPiece tokenizer files), written atomically together.
- **verify**: transformers' two classes loaded from the folders vs our checkpoint at TP1 on
  :func:`formats.verify.fixed_batch`: discriminator logits and generator MLM logits at the real positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bio_megatron.families.electra import (DISCRIMINATOR_CLASSES, ELECTRA, electra_configs, electra_hf_to_mcore,
                                           electra_mcore_to_hf, generator_problems)
from bio_megatron.formats.saved import saved_model_config
from bio_megatron.formats.source import Source, read_hf_config
from bio_megatron.formats.state import ModelState, unpadded
from bio_megatron.utils.errors import CheckpointError, ConfigError
from bio_megatron.utils.io import atomic_path, check_output_dir, load_json
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
SUBFOLDERS = ("discriminator", "generator")
# The top-level modules of our ELECTRA model an HF source may lack (a discriminator alone, a bare ElectraModel):
# initialised fresh, in this order in the warning and the result's ``fresh``.
MAY_BE_FRESH = ("discriminator_head", "generator")


def _model_config(shape: dict, **extra):
    from bio_megatron.config.pretrain import ModelConfig

    shape = {k: v for k, v in shape.items() if k != "family"}  # the source's, which is this one
    return ModelConfig(**shape, family=ELECTRA.name, objective="electra", bert_binary_head=False,
                       transformer_impl="local", **extra)


def fresh_generator_fraction(hidden: int) -> float:
    """The paper's generator size for a discriminator of width ``hidden`` when none is imported: 1/4 for
    ELECTRA-large widths (>= 1024), 1/3 (ELECTRA-base) below; 1/3 of 1024 would give 341, which 64-wide heads
    do not divide."""
    return 1 / 4 if hidden >= 1024 else 1 / 3


def import_electra(src: Source, generator: str | Path | None, out: str | Path, overwrite: bool, verify: bool,
                   tolerance: float | None) -> dict:
    """``import hf`` of an ELECTRA discriminator folder (``src``, already checked by ``resolve_source``) and
    optionally its generator: one model-only checkpoint at TP1, loadable at any TP."""
    from bio_megatron.config.family_keys import electra_problems, electra_shapes
    from bio_megatron.config.pretrain import PretrainConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.formats.hf.files import IMPORT_COMMAND
    from bio_megatron.formats.hf.read import read_hf_weights
    from bio_megatron.formats.ours import write_ours
    from bio_megatron.models.hf_convert import check_config_tensors
    from bio_megatron.vocab.bpe import load_tokenizer

    check_output_dir(out, IMPORT_COMMAND, overwrite)
    disc_cfg = load_json(src.path / "config.json")
    if verify:
        _check_verifiable(src.path, disc_cfg)
    m = _model_config(src.shape)
    m.generator_hidden_fraction = fresh_generator_fraction(m.shape().hidden_size)
    gen_cfg = gen_dir = None
    if generator is not None:
        gen_dir = Path(generator)
        if not (gen_dir / "config.json").is_file():
            raise CheckpointError(f"{gen_dir}: not a Hugging Face folder (no config.json)")
        gen_cfg = read_hf_config(gen_dir / "config.json")
        m.generator_hidden_fraction = gen_cfg["hidden_size"] / disc_cfg["hidden_size"]
    problems = electra_problems(m)
    if gen_cfg is not None and not problems:
        problems = generator_problems(gen_cfg, disc_cfg, electra_shapes(m))
    if problems:
        where = f"{gen_dir}/config.json" if gen_cfg is not None else f"{src.path}/config.json"
        raise CheckpointError(f"{where}: cannot be imported as ELECTRA: " + "; ".join(problems))
    tok = load_tokenizer(src.vocab_file, src.lowercase)
    padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 1)
    # Every refusal that reads weights (shared embeddings, tied output) comes before a process group exists.
    disc_sd, gen_sd = read_hf_weights(src.path), read_hf_weights(gen_dir) if gen_dir else None
    check_config_tensors(disc_cfg, disc_sd, str(src.path))
    if gen_sd is not None:
        check_config_tensors(gen_cfg, gen_sd, str(gen_dir))
    try:
        full = electra_hf_to_mcore(disc_sd, gen_sd, m.shape(), electra_shapes(m), padded, f"{gen_dir or src.path}")
    except KeyError as exc:
        raise CheckpointError(f"{gen_dir or src.path}: weight {exc.args[0]} is missing (not an ELECTRA "
                              "checkpoint?)") from None
    state = ModelState(unpadded(full, tok.vocab_size), m, ELECTRA.name, Path(src.vocab_file), tok.vocab_size,
                       tok.lowercase, source=str(src.path),
                       origin={"generator_from": str(gen_dir) if gen_dir else None})
    missing = [name for name in MAY_BE_FRESH if not any(k.startswith(f"{name}.") for k in full)]
    if missing:  # BioELECTRA publishes discriminators only: keep a trainable generator / head, say so
        log.warning("%s: no weights for %s in the source: freshly initialised (generator_hidden_fraction %.4g); "
                    "fine-tuning uses the discriminator only", src.path, ", ".join(missing),
                    m.generator_hidden_fraction)
    # verified in the hidden sibling before it is moved onto ``out``: above tolerance nothing is left at ``out``
    check = (lambda tmp, _tensors: verify_electra_import(src.path, gen_dir, tmp, tolerance)) if verify else None
    # what is fresh is seeded as a pretraining run of the default config would seed it
    report = write_ours(state, out, IMPORT_COMMAND, overwrite, check, fresh_head_seed=PretrainConfig().trainer.seed,
                        fresh=missing)
    result = {"out": str(out), "task": None, "labels": None, "objective": "electra",
              "generator_hidden_fraction": m.generator_hidden_fraction, "fresh": missing}
    if report is not None:
        result["verify"] = report
        if not report["verified"]:
            result["out"] = None
            return result
    log.info("imported ELECTRA %s%s -> %s", src.path, f" + {gen_dir}" if gen_dir else "", out)
    return result


def load_electra(src: Source, tp: int = 1):
    """Our ELECTRA checkpoint (any saved TP) at tensor-parallel size ``tp`` (the process group's): (model in eval
    mode, ModelConfig, tokenizer)."""
    from bio_megatron.models.electra import build_electra_model
    from bio_megatron.training.checkpoint import load_checkpoint
    from bio_megatron.vocab.bpe import load_tokenizer

    raw = saved_model_config(src.path)
    m = _model_config({k: v for k, v in src.shape.items()}, hidden_dropout=0.0, attention_dropout=0.0,
                      generator_hidden_fraction=float(raw.get("generator_hidden_fraction", 1 / 3)))
    m.tensor_model_parallel_size = tp
    if src.padded_vocab and int(src.padded_vocab) % tp:
        raise CheckpointError(f"{src.path}: padded vocabulary {src.padded_vocab} does not split over TP {tp}")
    if src.padded_vocab:  # rebuild the embedding exactly as saved (its padding depends on the saved TP size)
        m.make_vocab_size_divisible_by = int(src.padded_vocab) // tp
    tok = load_tokenizer(src.vocab_file, (raw.get("tokenizer") or {}).get("do_lower_case"))
    model = build_electra_model(m, tok.vocab_size, torch.float32)
    load_checkpoint(src.path, model, model_only=True)
    return model.eval(), m, tok


def electra_forward(model) -> callable:
    """(ids, mask, types) -> {"discriminator": [B, S, 1], "generator": [B, S, V/TP]} of our model. The
    discriminator's logits get a trailing axis so that :func:`formats.verify.compare` leaves out the padded
    positions as it does for MLM logits; generator logits are computed at every real position."""
    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        disc = model.discriminator_logits(ids, mask, types).unsqueeze(-1)
        rows = model.generator_logits(ids, mask, types, mask.bool()).squeeze(1)
        gen = rows.new_zeros(ids.shape + (rows.shape[-1],))
        gen[mask.bool()] = rows
        return {"discriminator": disc, "generator": gen}

    return forward


def _check_verifiable(disc_dir: Path, cfg: dict) -> None:
    arch = (cfg.get("architectures") or [""])[0]
    if arch != DISCRIMINATOR_CLASSES[0]:
        raise CheckpointError(f"{disc_dir}: --verify compares output heads; architectures {arch!r} has none "
                              "(a bare encoder gets a fresh discriminator head here)")


def verify_electra_import(disc_dir: str | Path, gen_dir: str | Path | None, checkpoint: str | Path,
                          tolerance: float | None = None) -> dict:
    """transformers' ``ElectraForPreTraining`` (and ``ElectraForMaskedLM``) from the folders vs our checkpoint."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from bio_megatron.formats.verify import FP32_TOLERANCE, verify_import
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.formats.source import resolve_source

    _check_verifiable(Path(disc_dir), load_json(Path(disc_dir) / "config.json"))
    single_process()
    disc = ElectraForPreTraining.from_pretrained(str(disc_dir)).eval()
    gen = ElectraForMaskedLM.from_pretrained(str(gen_dir)).eval() if gen_dir else None

    def reference(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"discriminator": disc(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.unsqueeze(-1)}
        if gen is not None:
            out["generator"] = gen(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        return out

    model, m, tok = load_electra(resolve_source(checkpoint))
    source = f"{disc_dir}{f' + {gen_dir}' if gen_dir else ''} via transformers"
    return verify_import(reference, checkpoint, tolerance=FP32_TOLERANCE if tolerance is None else tolerance,
                         source=source, ours=electra_forward(model), vocab_size=tok.vocab_size,
                         max_positions=m.max_position_embeddings)


def refuse_electra_export(src: Source, out: str | Path, overwrite: bool) -> None:
    """What ``export hf`` of an ELECTRA checkpoint refuses before any weight is read: a model card the user edited
    in either folder (``overwrite``), a byte-level BPE vocabulary (HF's ELECTRA classes tokenize with WordPiece)."""
    from bio_megatron.formats.hf.model_card import refuse_edited_card
    from bio_megatron.vocab.bpe import BPETokenizer, load_tokenizer

    if overwrite:  # a card the user edited in either folder is not replaced silently
        for name in SUBFOLDERS:
            refuse_edited_card(Path(out) / name)
    if isinstance(load_tokenizer(src.vocab_file, None), BPETokenizer):
        raise CheckpointError(f"{src.path}: a byte-level BPE vocabulary; Hugging Face's ELECTRA classes tokenize "
                              "with WordPiece (ElectraTokenizer), so this checkpoint has no ELECTRA export")


def export_electra(state: ModelState, out: str | Path, overwrite: bool, dtype: str) -> dict:
    """``export hf`` of an ELECTRA pretraining model (``state``: :func:`bio_megatron.formats.ours.read_ours`, its
    ``model`` carrying the objective and the generator's width): ``out/discriminator`` + ``out/generator``."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from bio_megatron.config.family_keys import electra_shapes
    from bio_megatron.formats.hf.files import EXPORT_COMMAND, EXPORT_DTYPES
    from bio_megatron.formats.hf.folder_modes import apply_umask_modes
    from bio_megatron.formats.hf.model_card import CARD_DIGEST_KEY, card_digest, model_card

    m, vocab_size = state.model, state.vocab_size
    if m.objective != "electra":
        raise CheckpointError(f"{state.source}: model.objective is {m.objective!r}, not electra: no generator to "
                              "export beside the discriminator")
    disc_sd, gen_sd = electra_mcore_to_hf(state.tensors, m.shape(), electra_shapes(m), vocab_size)
    disc_cfg, gen_cfg = electra_configs(m.shape(), electra_shapes(m), vocab_size, m.max_position_embeddings,
                                        m.num_tokentypes, m.layernorm_epsilon)
    models = {"discriminator": ElectraForPreTraining(disc_cfg), "generator": ElectraForMaskedLM(gen_cfg)}
    for name, sd in (("discriminator", disc_sd), ("generator", gen_sd)):
        missing, unexpected = models[name].load_state_dict(sd, strict=False)
        missing = [k for k in missing if k != "generator_lm_head.weight"]  # tied to the word embeddings
        if missing or unexpected:
            raise CheckpointError(f"conversion incomplete for the ELECTRA {name}: missing {missing[:5]}, "
                                  f"unexpected {unexpected[:5]}")
        models[name].to(EXPORT_DTYPES[dtype])
    with atomic_path(out, command=EXPORT_COMMAND, overwrite=overwrite) as tmp:
        tmp.mkdir()
        for name, hf in models.items():
            hf.save_pretrained(str(tmp / name), safe_serialization=True)
            ELECTRA.save_tokenizer(tmp / name, Path(state.vocab_file), state.lowercase)
            card = model_card(state.source, None, hf.config.architectures[0], False, None, dtype,
                              f"{Path(out).name}-{name}")
            (tmp / name / "README.md").write_text(card, encoding="utf-8")
            (tmp / name / "bio_megatron_export.json").write_text(json.dumps(
                {"source": state.source, "task": None, "class": hf.config.architectures[0], "remote_code": False,
                 "dtype": dtype, CARD_DIGEST_KEY: card_digest(card)}, indent=2) + "\n")
        apply_umask_modes(tmp)  # transformers writes the weights 0600: readable as the user's umask says
    classes = {name: hf.config.architectures[0] for name, hf in models.items()}
    log.info("exported ELECTRA %s -> %s/{discriminator,generator} (%s)", state.source, out,
             ", ".join(classes.values()))
    return {"out": str(out), "class": classes, "task": None, "labels": None, "remote_code": False, "dtype": dtype,
            "folders": {name: str(Path(out) / name) for name in SUBFOLDERS}}
