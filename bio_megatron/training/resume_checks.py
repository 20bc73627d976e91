"""What a checkpoint must share with the run that continues it: vocabulary (by content), shape, family and
optimizer settings. Checked before anything is loaded, so that a mismatch is one line naming the key and both
values instead of a megatron-core traceback halfway through a load or, worse, a run that silently continues
with other settings than the user asked for.

Resume (``exp_manager.resume_if_exists`` / ``resume_from_checkpoint``, fine-tuning's ``resume/``) restores the
model, the Adam state and the LR schedule *as saved*: megatron-core's scheduler takes its LR, warmup and decay
from the checkpoint (``use_checkpoint_opt_param_scheduler``), so a changed ``model.optim.lr`` was silently
ignored. Continued pretraining (``model.restore_from_path``) takes the weights only: there the vocabulary and
the shape must match, the optimizer starts afresh and may differ.

``model.optim.sched.override_opt_param_scheduler`` (Megatron-LM's flag) takes the LR-schedule keys (``SCHEDULE``)
from the run's config instead: those may then change.

Settings that may change on resume and are therefore not listed: ``trainer.max_steps`` (train longer: the decay
follows the new length unless ``model.optim.sched.decay_steps`` fixes it, see ``optimizer.Schedule``),
logging, validation and save intervals, TP/PP layout (dist-checkpointing reshards), data-parallel size,
``micro_batch_size`` (the global batch is what defines a step), ``use_distributed_optimizer`` and
``trainer.precision`` (converted with a warning, see ``checkpoint.load_checkpoint``), gradient clipping (not
state), the data blend (adding data to a running job is legitimate), dropout.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Any

import yaml

from bio_megatron.config.loader import from_dict, to_dict
from bio_megatron.utils.errors import CheckpointError, ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

# The resolved shape (``model.size`` plus single-field overrides): a different value is another tensor shape.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")
# key -> why it must equal the checkpoint's. Checked on resume; the "weights" ones on restore_from_path too.
CHECKED: dict[str, tuple[str, bool]] = {
    "model.max_position_embeddings": ("the position embedding's shape", True),
    "model.num_tokentypes": ("the token-type embedding's shape", True),
    "model.bert_binary_head": ("the NSP/SOP head exists or not", True),
    "model.transformer_block_type": ("pre-LN and post-LN layers are different models", True),
    "model.objective": ("the model family and its loss (bert, mlm, electra)", True),
    "model.generator_hidden_fraction": ("ELECTRA's generator shape", True),
    "model.embedding_size": ("ALBERT's factorised embedding shape", True),
    "model.hidden_act": ("the activation the weights were trained with", True),
    "model.encoder_seq_length": ("the samples a step reads (the data position is step x global batch)", False),
    "model.global_batch_size": ("the data position is step x global batch: another value re-reads or skips "
                                "samples", False),
    "model.optim.name": ("the optimizer (Adam variant or LAMB) whose state is restored", False),
    "model.optim.bias_correction": ("the restored LAMB moments were used with the checkpoint's update", False),
    "model.optim.lr": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.weight_decay": ("the restored schedule keeps the checkpoint's", False),
    "model.optim.betas": ("the restored Adam state was accumulated with the checkpoint's", False),
    "model.optim.eps": ("the restored Adam state was accumulated with the checkpoint's", False),
    "model.optim.layerwise_lr_decay": ("the restored param groups keep the checkpoint's per-layer rates", False),
    "model.optim.sched.name": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.sched.warmup_steps": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.sched.warmup_ratio": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.sched.min_lr": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.sched.decay_steps": ("the restored LR schedule keeps the checkpoint's", False),
    "model.optim.sched.constant_steps": ("the restored LR schedule keeps the checkpoint's", False),
}
# What model.optim.sched.override_opt_param_scheduler takes from the run's config instead of the checkpoint.
SCHEDULE = ("model.optim.lr", "model.optim.weight_decay", "model.optim.sched.name", "model.optim.sched.warmup_steps",
            "model.optim.sched.warmup_ratio", "model.optim.sched.min_lr", "model.optim.sched.decay_steps",
            "model.optim.sched.constant_steps")
OVERRIDE = "model.optim.sched.override_opt_param_scheduler=true"
VOCAB_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model", "tokenizer.json")


def vocab_files(vocab_file: str | Path) -> list[Path]:
    """The files a vocabulary is made of: ``vocab.txt``, or byte-level BPE's ``vocab.json`` + ``merges.txt``."""
    vocab_file = Path(vocab_file)
    if vocab_file.name == "vocab.json":
        return [vocab_file, vocab_file.parent / "merges.txt"]
    return [vocab_file]


def vocab_digest(files: list[Path]) -> str:
    """sha256 over the contents of the vocabulary's files in order (the file names do not matter: the checkpoint
    keeps its copy as ``vocab.txt``), so a same-size permutation differs."""
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def _get(d: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return False, None
        d = d[part]
    return True, d


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _saved_config(path: Path) -> dict | None:
    f = path / "config.yaml"
    if not f.is_file():
        return None
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CheckpointError(f"checkpoint {path}: config.yaml cannot be read ({exc.__class__.__name__})") from None
    return data if isinstance(data, dict) else None


def _resolved_shape(model_cfg_cls: type, model: dict) -> dict | None:
    try:
        return from_dict(model_cfg_cls, model).shape().__dict__
    except (ConfigError, KeyError, TypeError, AttributeError):
        return None  # a config of another version: the plain keys below still compare


def mismatches(path: Path, cfg, weights_only: bool) -> list[tuple[str, Any, Any, str]]:
    """``(key, this run's value, the checkpoint's value, why)`` for every checked setting that differs."""
    saved = _saved_config(path)
    if saved is None:
        log.warning("checkpoint %s has no config.yaml: its shape and optimizer settings cannot be compared", path)
        return []
    now = to_dict(cfg)
    override = bool(_get(now, OVERRIDE.split("=")[0])[1])
    out = []
    theirs = _resolved_shape(type(cfg.model), saved.get("model", {}))
    if theirs is not None:
        mine = cfg.model.shape().__dict__
        out += [(f"model.{k}", mine[k], theirs[k], "the tensors' shapes") for k in SHAPE_KEYS
                if not _same(mine[k], theirs[k])]
    for key, (why, for_weights) in CHECKED.items():
        if (weights_only and not for_weights) or (override and key in SCHEDULE):
            continue
        (has_now, a), (has_saved, b) = _get(now, key), _get(saved, key)
        if (weights_only and key == "model.objective" and {a, b} <= {"bert", "mlm"}
                and _get(now, "model.family")[1] == _get(saved, "model.family")[1] == "modernbert"):
            continue  # one ModernBERT model under both: the objective only picks the data rows (mlm: packed)
        if has_now and has_saved and not _same(a, b):
            out.append((key, a, b, why))
    return out


def vocab_mismatch(path: Path, run_vocab: str | Path) -> str | None:
    """The problem when the checkpoint's saved vocabulary differs in content from the run's, else None."""
    saved = [path / n for n in VOCAB_FILES if (path / n).is_file()]
    if not saved:
        log.warning("checkpoint %s holds no vocabulary file: its vocabulary cannot be compared", path)
        return None
    saved = vocab_files(saved[0]) if saved[0].name != "merges.txt" else saved
    mine = vocab_files(run_vocab)
    kind = {1: "a WordPiece vocab.txt", 2: "a byte-level BPE vocab.json + merges.txt"}
    if len(mine) != len(saved):
        return (f"model.tokenizer.vocab_file ({run_vocab}) is {kind[len(mine)]}, the checkpoint was trained with "
                f"{kind[len(saved)]}")
    a, b = vocab_digest(mine), vocab_digest(saved)
    if a == b:
        return None
    same = ""
    if mine[0].name == "vocab.txt" and _lines(mine[0]) == _lines(saved[0]):
        same = " (the same number of tokens: every id would silently mean another token)"
    return (f"model.tokenizer.vocab_file ({run_vocab}, sha256 {a[:12]}) differs in content from the vocabulary "
            f"the checkpoint was trained with ({saved[0]}, sha256 {b[:12]}){same}")


def _say_schedule_length(path: Path, cfg) -> None:
    """A longer (or shorter) ``trainer.max_steps`` re-plans the decay over the new length (``optimizer.Schedule``)
    unless ``decay_steps`` fixes it: say which."""
    saved = _saved_config(path) or {}
    (has_old, old), (_, decay) = _get(saved, "trainer.max_steps"), _get(to_dict(cfg), "model.optim.sched.decay_steps")
    if has_old and old != cfg.trainer.max_steps:
        log.info("trainer.max_steps is %s, the checkpoint's run had %s: the LR %s", cfg.trainer.max_steps, old,
                 f"decay keeps model.optim.sched.decay_steps={decay}" if decay is not None else
                 f"decay is re-planned to end at step {cfg.trainer.max_steps} (warm-up, LR and style as saved; "
                 f"the LR at each step is a {cfg.trainer.max_steps}-step run's)")


def _lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


def check_compatible(path: Path, cfg, run_vocab: str | Path, how: str, fix: str | None = None) -> None:
    """Refuse (one-line :class:`CheckpointError`) to continue from checkpoint ``path`` with a config that differs in
    a checked setting. ``how``: "resume" (model, optimizer and schedule restored) or "restore" (weights only,
    ``model.restore_from_path``). ``fix``: what the message advises instead of the pretraining remedies."""
    path = Path(path)
    weights_only = how == "restore"
    if fix is not None:
        pass
    elif weights_only:
        fix = ("use a checkpoint of this shape and vocabulary, or set these keys to the checkpoint's values")
    else:
        fix = (f"keep the checkpoint's value, start afresh with another exp_manager.name (or "
               f"exp_manager.resume_if_exists=false), or start a new run from its weights with a fresh optimizer: "
               f"{shlex.quote(f'model.restore_from_path={path}')}")  # quoted: it pastes into a shell
    problem = vocab_mismatch(path, run_vocab)
    if problem:
        raise CheckpointError(f"cannot {how} from checkpoint {path}: {problem}; "
                              "use the vocabulary the checkpoint was trained with (a copy is saved inside it) or "
                              "start afresh with another exp_manager.name")
    found = mismatches(path, cfg, weights_only)
    if not weights_only:
        _say_schedule_length(path, cfg)
    if found:
        key, mine, theirs, why = found[0]
        more = f" (and {', '.join(k for k, *_ in found[1:])})" if len(found) > 1 else ""
        if not weights_only and all(k in SCHEDULE for k, *_ in found):
            fix += f"; or take this run's LR schedule with {OVERRIDE} (Megatron-LM's --override-opt_param-scheduler)"
        raise CheckpointError(f"cannot {how} from checkpoint {path}: {key} is {mine!r} in this run's config but "
                              f"{theirs!r} in the checkpoint's ({why}){more}; {fix}")
