"""Our own checkpoints (any saved TP/PP layout) read at TP1: :func:`read_ours` is the one reader of a checkpoint
(pretraining or fine-tuned) into the formats' :class:`~bio_megatron.formats.state.ModelState`, which ``export hf``,
``export megatron-lm`` and ``export nemo`` write from; :func:`read_pretraining` gives the runnable pretraining model
that every ``import ... --verify`` runs. :func:`write_ours` is the one writer: every importer (``import hf``,
``import megatron-lm``, ``import nemo``) reads its format into a ``ModelState`` and saves it through it.

A fine-tuned model's encoder + head load through :func:`bio_megatron.formats.finetuned.load_finetuned`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.families import family_of_model
from bio_megatron.formats.saved import saved_model_config
from bio_megatron.formats.state import ModelState, unpadded
from bio_megatron.formats.source import Source, resolve_source
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.bpe import load_tokenizer

log = get_logger(__name__)


# What decides the pretraining model a checkpoint holds beyond its family's shape: ELECTRA's objective and its
# generator's width (without them an ELECTRA checkpoint would be built as BERT, or with a 1/3-wide generator).
PRETRAINING_KEYS = ("objective", "generator_hidden_fraction")


def pretraining_config(src: Source) -> tuple[ModelConfig, dict]:
    """(ModelConfig, saved ``model`` section) of a pretraining checkpoint ``src``: its saved shape, family, binary
    head and :data:`PRETRAINING_KEYS`; dropout off and the local transformer, as every reader at TP1 builds it. No
    weights are read."""
    if src.kind != "checkpoint":
        raise CheckpointError(f"{src.path}: a Hugging Face folder, not a checkpoint of ours")
    raw = saved_model_config(src.path)
    saved = {k: raw[k] for k in PRETRAINING_KEYS if raw.get(k) is not None}
    m = ModelConfig(**src.shape, **saved, bert_binary_head=bool(raw.get("bert_binary_head", False)),
                    hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local")
    return m, raw


def load_pretraining_model(src: Source, m: ModelConfig, vocab_size: int) -> torch.nn.Module:
    """The family's pretraining model of ``m`` filled from checkpoint ``src`` (resharded to this TP1 process), in
    eval mode. The embedding is rebuilt exactly as saved (its padding depends on the saved TP size)."""
    from bio_megatron.training.checkpoint import load_checkpoint

    divisible = m.make_vocab_size_divisible_by
    if src.padded_vocab:
        m.make_vocab_size_divisible_by = int(src.padded_vocab)
    model = family_of_model(m).build_pretraining_model(m, vocab_size, torch.float32).eval()
    load_checkpoint(src.path, model, model_only=True)
    m.make_vocab_size_divisible_by = divisible  # the config as saved: writers pad for their own layout
    return model


def tokenizer_of(src: Source, raw: dict):
    """The tokenizer saved beside checkpoint ``src`` (WordPiece, byte-level BPE or SentencePiece), with the
    casing its config (``raw``: the model section) recorded."""
    return load_tokenizer(src.vocab_file, (raw.get("tokenizer") or {}).get("do_lower_case"))


def read_pretraining(src: Source) -> tuple[torch.nn.Module, ModelConfig, object]:
    """A pretraining checkpoint at TP1 in eval mode: (model, ModelConfig, tokenizer)."""
    m, raw = pretraining_config(src)
    tok = tokenizer_of(src, raw)
    return load_pretraining_model(src, m, tok.vocab_size), m, tok


# The head settings a fine-tuned model section holds (NER/QA: ``head``, RE/classify: ``classifier_head``).
_HEAD_KEYS = ("num_fc_layers", "num_output_layers", "fc_dropout", "activation", "use_transformer_init")


def _on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in tensors.items()}  # normalise() kept tensors only


def read_ours(checkpoint: str | Path, default_labels: Sequence[str] | None = None,
              accept: Callable[[Source], None] | None = None) -> ModelState:
    """Our checkpoint ``checkpoint`` (pretraining or fine-tuned; directory, its checkpoints folder or run dir; any
    saved layout) as a :class:`ModelState`, resharded into this one-process TP1 world. ``default_labels``: as
    :func:`~bio_megatron.formats.finetuned.load_finetuned` (a classify model without ``label_ids.csv``).
    ``accept(src)``: a writer's refusal (CheckpointError) of what it cannot hold, run before any weight is read.
    CheckpointError for anything that is not a checkpoint of ours, before a process group exists."""
    from bio_megatron.formats.finetuned import load_finetuned
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.models.hf_convert import normalise

    src = resolve_source(checkpoint)
    if src.kind != "checkpoint":
        raise CheckpointError(f"{checkpoint}: a Hugging Face folder, not a checkpoint of ours; import it first "
                              "(bio-megatron import hf)")
    if accept is not None:
        accept(src)
    single_process()
    head: dict[str, torch.Tensor] = {}
    settings: dict = {}
    # on the CPU: a writer's torch.save would otherwise tag them with the GPU they were read onto, and a CPU-only
    # machine's plain torch.load of the export would fail
    if src.task is None:
        model, m, tok = read_pretraining(src)
        tensors, labels = _on_cpu(normalise(model.state_dict())), None
    else:
        loaded = load_finetuned(src.path, default_labels=default_labels)
        m, tok, labels = loaded.cfg.model, loaded.tokenizer, loaded.labels
        full = _on_cpu(normalise(loaded.model.state_dict()))
        head = {k: v for k, v in full.items() if k.startswith("head.")}
        tensors = {k: v for k, v in full.items() if not k.startswith("head.")}
        h = m.classifier_head if hasattr(m, "classifier_head") else m.head
        settings = {k: getattr(h, k) for k in _HEAD_KEYS if hasattr(h, k)}
    return ModelState(unpadded(tensors, tok.vocab_size), m, family_of_model(m).name, Path(src.vocab_file),
                      tok.vocab_size, getattr(tok, "lowercase", None), src.task, labels, head, settings,
                      str(src.path))


# --- writing ------------------------------------------------------------------------------------------------
class _VerifyFailed(Exception):
    """Raised inside :func:`save_verified`'s atomic block so that the unverified checkpoint is never moved in."""

    def __init__(self, report: dict) -> None:
        super().__init__(report)
        self.report = report


def save_verified(out: str | Path, command: str, overwrite: bool, save: Callable[[Path], None],
                  verify: Callable[[Path], dict] | None = None) -> dict | None:
    """``save(tmp)`` writes the imported checkpoint into the absent hidden sibling ``tmp``; ``verify(tmp)``
    (``import ... --verify``) checks it there, before it is renamed onto ``out``. Above tolerance the sibling is
    removed and ``out`` is left as it was (absent, or an earlier output under --overwrite): a failed verification
    never leaves a checkpoint that looks finished. Returns the report (None without ``verify``); its
    ``checkpoint`` is ``out``, or None when nothing was written (the CLI then exits 1)."""
    from bio_megatron.utils.io import atomic_path

    report = None
    try:
        # save_model_checkpoint writes atomically into ``tmp``; atomic_path then applies the folder rule (marker,
        # --overwrite) when moving it onto ``out``
        with atomic_path(out, command=command, overwrite=overwrite) as tmp:
            save(tmp)
            if verify is not None:
                report = verify(tmp)
                report["checkpoint"] = str(out)  # where it lands: tmp is a hidden name that is gone afterwards
                if not report["verified"]:
                    raise _VerifyFailed(report)
    except _VerifyFailed as failed:
        report = failed.report
        report["checkpoint"] = None
        log.error("%s: not written: --verify found a max absolute difference of %.3g, above --tolerance %.3g (%s)",
                  out, report["max_abs_diff"], report["tolerance"], report["reference"])
    return report


def saved_vocab_name(vocab_file: str | Path) -> str:
    """The name a vocabulary file takes inside our checkpoint (``training/checkpoint.py`` copies it so)."""
    path = Path(vocab_file)
    if path.name in ("vocab.json", "tokenizer.json"):
        return path.name
    return "spiece.model" if path.suffix == ".model" else "vocab.txt"


def _fresh_prefixes(fresh: Sequence[str], full: dict, built: dict, source: str) -> tuple[str, ...]:
    """The pretraining model's modules a written checkpoint draws fresh: those named in ``fresh``, else the MLM head
    of a bare encoder (HF BertModel, an encoder-only file; ELECTRA's MLM head is the generator's, named in ``fresh``)."""
    if fresh:
        return tuple(f"{name}." for name in fresh)
    if "lm_head.dense.weight" not in full and "lm_head.dense.weight" in built:
        log.info("%s has no MLM head: initialising one (the encoder is what fine-tuning uses)", source)
        return ("lm_head.", "output_layer.bias")
    return ()


def write_ours(state: ModelState, out: str | Path, command: str, overwrite: bool = False,
               verify: Callable[[Path, dict[str, torch.Tensor]], dict] | None = None,
               fresh_head_seed: int = 0, fresh: Sequence[str] = ()) -> dict | None:
    """Our checkpoint (TP1, model weights only; loadable at any layout) of ``state`` at ``out``: the family's
    pretraining model, or for a fine-tuned state the task model (encoder + ``state.head``), built at TP1 and
    filled from the state; ``config.yaml`` (``state.model`` in a pretraining or task config), the vocabulary,
    ``label_ids.csv``, ``bio_megatron.json`` (``imported_from``: ``state.source``, plus ``state.origin``) and
    the checksums. A pretraining state without an MLM head (a bare encoder) gets a fresh one, initialised with
    ``fresh_head_seed``; so are the pretraining model's top-level modules named in ``fresh`` that the state lacks
    (ELECTRA's generator and discriminator head: BioELECTRA publishes discriminators only), as a pretraining run
    would start them. ``verify(tmp, tensors)`` (``import ... --verify``; ``tensors``: the full TP1 state the
    model was filled with) checks the written checkpoint before it is moved onto ``out``
    (:func:`save_verified`). Returns the verify report, or None."""
    from bio_megatron.config.finetune import CONFIG_CLASSES
    from bio_megatron.config.pretrain import PretrainConfig
    from bio_megatron.config.sizes import padded_vocab_size
    from bio_megatron.families import family_named
    from bio_megatron.parallel.distributed import single_process
    from bio_megatron.families.task import build_task_model
    from bio_megatron.formats.fill import load_full_state
    from bio_megatron.models.heads import build_head
    from bio_megatron.models.init import init_weights
    from bio_megatron.training.checkpoint import save_model_checkpoint

    single_process()
    m, task, labels = state.model, state.task, state.labels
    padded = padded_vocab_size(state.vocab_size, m.make_vocab_size_divisible_by, 1)
    full = dict(state.tensors)
    if task is None:
        cfg = PretrainConfig(model=m)
        m.bert_binary_head = state.binary_head
        model = family_named(state.family).build_pretraining_model(m, state.vocab_size, torch.float32)
        # Only the modules the source lacks are drawn (each initial value depends on its own key alone, so they are
        # the values a whole-model initialisation gives them); the rest come from ``full`` below.
        prefixes = _fresh_prefixes(fresh, full, model.state_dict(), state.source)
        if prefixes:
            init_weights(model, fresh_head_seed, m.init_method_std, m.shape().num_layers, only=prefixes)
            full.update({k: v for k, v in model.state_dict().items()
                         if k.startswith(prefixes) and k not in full and torch.is_tensor(v)})
    else:
        cfg = CONFIG_CLASSES[task]()
        cfg.model = m
        head = build_head(task, m, m.shape().hidden_size, len(labels) if labels else 2)
        # every weight comes from ``full`` below (load_full_state refuses a missing one): no initial values drawn
        model = build_task_model(m, padded, head, torch.float32, seed=0, pre_process=True, post_process=True,
                                 initialise=False)
        full.update(state.head)
    load_full_state(model, full)
    m.tokenizer.vocab_file, m.tokenizer.do_lower_case = saved_vocab_name(state.vocab_file), state.lowercase
    meta = {"imported_from": state.source, "layout": {"tp": 1, "pp": 1, "dp": 1, "distributed_optimizer": False},
            "task": task, "vocab_size": state.vocab_size, "padded_vocab_size": padded, "labels": labels,
            **state.origin}

    def save(tmp: Path) -> None:
        save_model_checkpoint(tmp, model, cfg, state.vocab_file, meta,
                              files={"label_ids.csv": "\n".join(labels) + "\n"} if labels else None)

    # verified in the hidden sibling before it is moved onto ``out``: above tolerance nothing is left at ``out``
    return save_verified(out, command, overwrite, save,
                         (lambda tmp: verify(tmp, full)) if verify is not None else None)
