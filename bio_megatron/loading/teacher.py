"""The distillation teacher (``model.teacher.restore_from_path``): any source :func:`resolve_source` reads (our
checkpoint or run, a Hugging Face folder, a ``.nemo`` archive, a Megatron-LM checkpoint), built as its family's
pretraining model (encoder + MLM head) at the run's tensor-parallel layout, in its own precision, forward only.

What is checked before any weight is read, each a one-line error (exit 2): a source that does not resolve or load,
a fine-tuned (task) model, an ELECTRA teacher (no MLM head over its discriminator), another vocabulary than the
student's (by content), a shape the layout cannot split, a sequence longer than its positions, a student wider
than the teacher when the cosine term projects the student up to the teacher's width.

Task-specific distillation (``finetune <task>``) loads a *fine-tuned* teacher instead (:func:`load_task_teacher`):
encoder + task head at the run's tensor-parallel layout, refused (one line, exit 2, before the run folder exists)
when it was fine-tuned on another task or is a pretraining model, predicts other labels (both lists named), reads
another vocabulary, or has a shape the layout cannot split.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from megatron.core import parallel_state as ps

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.families import family_named
from bio_megatron.formats.hf.read import read_hf_state
from bio_megatron.formats.source import apply_source_shape, resolve_source
from bio_megatron.families.task import build_task_model, init_task_model
from bio_megatron.formats.fill import load_full_state, load_into, task_padded_vocab
from bio_megatron.models.bert import dtype_name, precision_dtype
from bio_megatron.training import checkpoint as ckpt
from bio_megatron.training.distill_memory import check_distill_fits
from bio_megatron.training.resume_checks import vocab_digest, vocab_files
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
# The ModelConfig fields that make an encoder's shape (what formats/source.py takes over from a checkpoint)
_SHAPE_FIELDS = ("size", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                 "max_position_embeddings", "num_tokentypes", "transformer_block_type", "embedding_size", "hidden_act",
                 "global_rope_theta", "local_rope_theta", "local_attention", "global_attn_every_n_layers", "family")


def _tokens(vocab_file: Path) -> list[str]:
    """A vocabulary's entries in id order (WordPiece lines; BPE's vocab.json, merges compared by digest)."""
    if vocab_file.name == "vocab.json":
        import json

        table = json.loads(vocab_file.read_text(encoding="utf-8"))
        return [t for t, _ in sorted(table.items(), key=lambda kv: kv[1])]
    return [line.rstrip("\r\n") for line in vocab_file.read_text(encoding="utf-8").splitlines()]


def _same_vocabulary(student: Path, teacher: Path) -> bool:
    mine, theirs = vocab_files(student), vocab_files(teacher)
    if len(mine) != len(theirs) or not all(p.is_file() for p in mine + theirs):
        return False
    if vocab_digest(mine) == vocab_digest(theirs):
        return True
    # an HF folder with only tokenizer.json gives a regenerated vocab.txt: compare the entries themselves
    return len(mine) == 1 and _tokens(mine[0]) == _tokens(theirs[0])


def teacher_config(student: ModelConfig, shape: dict) -> ModelConfig:
    """The teacher's model config: its own shape and family, the student's layout, vocabulary padding and kernels
    (the vocabulary-parallel KL needs both vocabularies split alike), no dropout (forward only)."""
    m = ModelConfig(**shape)
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size = student.tensor_model_parallel_size, 1
    m.make_vocab_size_divisible_by = student.make_vocab_size_divisible_by
    m.hidden_dropout = m.attention_dropout = 0.0
    m.transformer_impl, m.attention_backend = student.transformer_impl, student.attention_backend
    m.bert_binary_head, m.tokenizer = False, student.tokenizer
    return m


def teacher_problems(student: ModelConfig, m: ModelConfig, alpha_cos: float) -> list[str]:
    tp, s, st = student.tensor_model_parallel_size, m.shape(), student.shape()
    problems = []
    if s.num_attention_heads % tp or s.ffn_hidden_size % tp:
        problems.append(f"its num_attention_heads ({s.num_attention_heads}) and ffn_hidden_size "
                        f"({s.ffn_hidden_size}) must be divisible by model.tensor_model_parallel_size ({tp}), which "
                        "teacher and student share")
    if student.encoder_seq_length > m.max_position_embeddings:
        problems.append(f"model.encoder_seq_length ({student.encoder_seq_length}) exceeds its "
                        f"max_position_embeddings ({m.max_position_embeddings})")
    if alpha_cos and st.hidden_size > s.hidden_size:
        problems.append(f"the student's hidden_size ({st.hidden_size}) is wider than its ({s.hidden_size}): the "
                        "cosine term projects the student up to the teacher's width; use a narrower student or "
                        "model.distill.alpha_cos=0")
    return problems


def load_teacher(cfg, vocab_file: str | Path, vocab_size: int, trainer_precision) -> torch.nn.Module:
    """This rank's teacher (after ``init_model_parallel``): eval mode, no gradients, weights from the source.
    ``cfg``: the ``DistillConfig``; ``vocab_file``/``vocab_size``: the student's tokenizer. Every refusal names
    ``model.teacher.restore_from_path``."""
    try:
        return _load_teacher(cfg, vocab_file, vocab_size, trainer_precision)
    except CheckpointError as exc:
        if str(exc).startswith("model.teacher.restore_from_path"):
            raise
        raise CheckpointError(f"model.teacher.restore_from_path: {exc}") from None


def inspect_teacher(cfg, vocab_file: str | Path):
    """The teacher's source, family and model config, checked against the student without reading a weight or
    joining a process group (``distill --dry-run`` shows it); CheckpointError for any refusal."""
    try:
        return _inspect(cfg, vocab_file)
    except CheckpointError as exc:
        if str(exc).startswith("model.teacher.restore_from_path"):
            raise
        raise CheckpointError(f"model.teacher.restore_from_path: {exc}") from None


def _inspect(cfg, vocab_file: str | Path):
    student = cfg.model
    where = student.teacher.restore_from_path
    src = resolve_source(where)
    if src.task is not None:
        raise CheckpointError(f"model.teacher.restore_from_path ({where}) is a fine-tuned {src.task} model; "
                              "task-agnostic distillation needs a pretraining model with its masked-LM head")
    family = family_named(src.shape["family"])
    if family.name == "electra":
        raise CheckpointError(f"model.teacher.restore_from_path ({where}) is an ELECTRA model, whose discriminator "
                              "has no masked-LM head to distil from")
    if src.vocab_file is None or not _same_vocabulary(Path(vocab_file), Path(src.vocab_file)):
        raise CheckpointError(f"model.teacher.restore_from_path ({where}): its vocabulary ({src.vocab_file}) is not "
                              f"the student's (model.tokenizer.vocab_file: {vocab_file}); teacher and student must "
                              "share one vocabulary, token for token")
    m = teacher_config(student, src.shape)
    problems = teacher_problems(student, m, student.distill.alpha_cos)
    if problems:
        raise CheckpointError(f"model.teacher.restore_from_path ({where}): " + "; ".join(problems))
    return src, family, m


def _load_teacher(cfg, vocab_file: str | Path, vocab_size: int, trainer_precision) -> torch.nn.Module:
    student = cfg.model
    where = student.teacher.restore_from_path
    src, family, m = _inspect(cfg, vocab_file)
    dtype = precision_dtype(student.teacher.precision or trainer_precision)
    # both models share the vocabulary padding (teacher_config), so one padded size serves both
    padded = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    if not cfg.trainer.skip_memory_check:  # before the teacher (and the student, built later) is allocated
        check_distill_fits(student, padded, precision_dtype(trainer_precision), m, padded, dtype,
                           ps.get_data_parallel_world_size())
    teacher = family.build_pretraining_model(m, vocab_size, dtype)
    if src.kind == "hf":
        full = read_hf_state(src.path, m.shape(), padded)
        if "lm_head.dense.weight" not in full:
            raise CheckpointError(f"model.teacher.restore_from_path ({where}) has no masked-LM head (a bare encoder): "
                                  "the KL term needs the teacher's predictions")
        load_full_state(teacher, full)
    else:
        ckpt.load_checkpoint(src.path, teacher, model_only=True, compute_dtype=dtype_name(dtype))
    teacher.eval()
    teacher.requires_grad_(False)
    s = m.shape()
    log.info("teacher %s (%s): %d layers, hidden %d, heads %d, %s, forward only", where, family.name, s.num_layers,
             s.hidden_size, s.num_attention_heads, dtype_name(dtype))
    return teacher


# ---- task-specific distillation: a fine-tuned teacher of the student's task ----------------------------------------

def inspect_task_teacher(cfg, labels: list[str] | None, vocab_file: str | Path):
    """The fine-tuned teacher of ``finetune <cfg.task>``: its source and model config (its own encoder shape and
    head, the student's TP layout, PP 1, no dropout), checked against the student before any weight is read.
    ``labels``: the student task's label list (None for QA). One CheckpointError naming
    ``model.teacher.restore_from_path`` for each refusal: another task or a pretraining model, other labels,
    another vocabulary, a shape the layout cannot split."""
    student = cfg.model
    where = student.teacher.restore_from_path
    try:
        src = resolve_source(where)
    except CheckpointError as exc:
        raise CheckpointError(f"model.teacher.restore_from_path: {exc}") from None
    if src.task != cfg.task:
        what = f"a fine-tuned {src.task} model" if src.task else "a pretraining model (no task head)"
        raise CheckpointError(f"model.teacher.restore_from_path ({where}) is {what}; finetune {cfg.task} distils "
                              f"from a teacher fine-tuned on {cfg.task} (its logits are what the student learns)")
    if src.labels is not None and list(src.labels) != list(labels or []):
        raise CheckpointError(f"model.teacher.restore_from_path ({where}): the teacher's labels {list(src.labels)} "
                              f"are not the student's {list(labels or [])} (read from model.dataset.data_dir "
                              f"{cfg.model.dataset.data_dir}); teacher and student must predict the same labels in "
                              "the same order")
    if src.vocab_file is None or not _same_vocabulary(Path(vocab_file), Path(src.vocab_file)):
        raise CheckpointError(f"model.teacher.restore_from_path ({where}): its vocabulary ({src.vocab_file}) is not "
                              f"the student's ({vocab_file}); teacher and student must share one vocabulary, token "
                              "for token (they read the same input ids)")
    m, fresh = copy.deepcopy(student), type(student)()
    for key in _SHAPE_FIELDS:  # a checkpoint records only what it set: the student's own values must not remain
        setattr(m, key, getattr(fresh, key))
    apply_source_shape(m, src)
    for block in ("head", "classifier_head"):  # the teacher's head as it was trained
        for k, v in ((src.head or {}).get(block) or {}).items():
            if hasattr(getattr(m, block, None), k):
                setattr(getattr(m, block), k, v)
    if "fc_hidden_size" in (src.head or {}):
        m.fc_hidden_size = src.head["fc_hidden_size"]
    m.pipeline_model_parallel_size = 1
    m.hidden_dropout = m.attention_dropout = 0.0
    m.restore_from_path, m.teacher = None, type(student.teacher)()
    problems = teacher_problems(student, m, 0.0)
    if problems:
        raise CheckpointError(f"model.teacher.restore_from_path ({where}): " + "; ".join(problems))
    return src, m


def load_task_teacher(cfg, labels: list[str] | None, vocab_file: str | Path, vocab_size: int, build_head,
                      seed: int) -> torch.nn.Module:
    """This rank's fine-tuned teacher (after ``init_model_parallel``), encoder + head filled from its source, in
    eval mode with no gradients, in ``model.teacher.precision`` (null: ``trainer.precision``). ``build_head``:
    the task's ``build_head(model_cfg)``, given the teacher's config."""
    src, m = inspect_task_teacher(cfg, labels, vocab_file)
    dtype = precision_dtype(cfg.model.teacher.precision or cfg.trainer.precision)
    teacher = build_task_model(m, task_padded_vocab(m, vocab_size, src), build_head(m), dtype, seed,
                               pre_process=True, post_process=True, initialise=False)
    try:
        init_task_model(teacher, m, seed, load_into(teacher, src, encoder_only=False))
    except CheckpointError as exc:
        raise CheckpointError(f"model.teacher.restore_from_path: {exc}") from None
    teacher.eval()
    teacher.requires_grad_(False)
    s = m.shape()
    log.info("teacher %s (fine-tuned %s, %s): %d layers, hidden %d, %s, forward only", src.origin or src.path,
             cfg.task, src.shape["family"], s.num_layers, s.hidden_size, dtype_name(dtype))
    return teacher
