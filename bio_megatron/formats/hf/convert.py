"""``export hf`` / ``import hf``: BioMegatron checkpoints <-> Hugging Face folders.

Export loads the checkpoint (saved at any TP/PP layout) into one TP1 process through dist-checkpointing
resharding, converts the encoder with :mod:`bio_megatron.models.hf_convert` and maps the head
(:mod:`bio_megatron.formats.hf.heads`). A head that equals one of transformers' fixed heads becomes the plain
class; every other head (the paper's MLPs: 2 layers, ``fc_hidden_size`` 512-2048, relu) becomes the
matching ``BioMegatronFor*`` class, whose code the folder carries (``trust_remote_code=True``):

=========  =========================================  ==================================================
task       plain HF class (no remote code)            when the head is
=========  =========================================  ==================================================
(none)     MegatronBertForMaskedLM / ForPreTraining   the LM head (+ NSP head when trained with it)
ner        MegatronBertForTokenClassification         ``head.num_fc_layers: 1`` -> ``classifier``
qa         MegatronBertForQuestionAnswering           ``head.num_fc_layers: 1`` -> ``qa_outputs``
re         MegatronBertForSequenceClassification      ``classifier_head.num_output_layers: 2``,
                                                      ``activation: tanh``, ``fc_hidden_size`` null or the
                                                      encoder width -> ``bert.pooler`` + ``classifier``
classify   MegatronBertForSequenceClassification      the same head (BLURB datasets; ``problem_type``
                                                      single-label / regression / multi-label; any other
                                                      head is refused: :mod:`~.classify`)
=========  =========================================  ==================================================

=========  =========================================  ==================================================
task       remote-code class (any other head)         ``auto_map`` entry
=========  =========================================  ==================================================
ner        BioMegatronForTokenClassification          AutoModelForTokenClassification
qa         BioMegatronForQuestionAnswering            AutoModelForQuestionAnswering
re         BioMegatronForSequenceClassification       AutoModelForSequenceClassification
=========  =========================================  ==================================================

A post-LN checkpoint (``model.transformer_block_type: post_ln``) exports to the same classes of the original
BERT family (``BertForMaskedLM`` / ``BertForPreTraining``, ``BertFor{TokenClassification,QuestionAnswering,
SequenceClassification}`` for the heads above, ``model_type: bert``); ``import hf`` reads ``bert`` folders
(``BertModel`` too: a fresh MLM head is initialised). The remote-code classes are pre-LN only.

The remote-code folder adds ``modeling_bio_megatron.py`` (a verbatim copy of
:mod:`bio_megatron.formats.hf.modeling`), ``model_type: bio-megatron-bert``, ``auto_map`` (AutoConfig + the
AutoModel above) and ``bio_megatron_head`` to ``config.json``; head weights keep our names (``head.mlp.*``).
Every folder gets ``model.safetensors``, ``config.json`` (``id2label``/``label2id``), ``vocab.txt`` +
tokenizer files, ``label_ids.csv`` and ``bio_megatron_export.json``. ``import hf`` (and ``finetune``/
``predict`` from an HF folder) read both kinds back with the same head.
Reading a folder's weights and head back is :mod:`bio_megatron.formats.hf.read` (``finetune`` and ``predict`` load HF
folders too); this module writes folders, and imports them as checkpoints: :func:`read_hf` gives the folder's
``ModelState``, which :func:`bio_megatron.formats.ours.write_ours` (the writer every importer shares) saves.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bio_megatron.config.pretrain import ModelConfig, PretrainConfig
from bio_megatron.families import Family, family_named, family_of_model
from bio_megatron.families.electra import ELECTRA
from bio_megatron.families.megatron_bert import REMOTE_MODEL_TYPE
from bio_megatron.formats.hf.classify import ClassifyDataset, classify_export_fields, classify_problems
from bio_megatron.formats.hf.files import EXPORT_COMMAND, EXPORT_DTYPES, IMPORT_COMMAND
from bio_megatron.formats.hf.folder_modes import apply_umask_modes
from bio_megatron.formats.hf.heads import (head_settings, plain_class, remote_config_fields, remote_head,
                                          write_remote_code)
from bio_megatron.formats.hf.model_card import CARD_DIGEST_KEY, card_digest, model_card, refuse_edited_card
from bio_megatron.formats.hf.read import CLASS_TASK, REMOTE_CLASS, read_hf_state
from bio_megatron.formats.ours import pretraining_config, read_ours, write_ours
from bio_megatron.formats.source import Source, resolve_source, task_config_for_hf
from bio_megatron.formats.state import ModelState, unpadded
from bio_megatron.formats.finetuned import load_finetuned
from bio_megatron.parallel.distributed import single_process
from bio_megatron.utils.errors import CheckpointError, ConfigError
from bio_megatron.utils.io import atomic_path, check_output_dir, load_json
from bio_megatron.utils.log import get_logger
from bio_megatron.vocab.bpe import load_tokenizer

log = get_logger(__name__)




def export_hf(checkpoint: str | Path, out: str | Path, overwrite: bool = False, dtype: str = "fp32",
              classify_dataset: ClassifyDataset | None = None) -> dict:
    """Write an HF folder for ``checkpoint`` (pretraining or fine-tuned, any saved layout); returns a summary.
    ``out`` must be absent or empty, or (``overwrite``) an earlier ``export hf`` output. ``dtype`` (fp32, bf16)
    is the weights' dtype in the folder; fp32 from a bf16/fp16 run takes its fp32 main parameters.
    ``classify_dataset``: a BLURB dataset's labels and mode by name, for a ``classify`` checkpoint
    (:mod:`.classify`; ``tasks/`` knows them, above this folder, so the caller hands them down)."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype ({dtype!r}) must be one of {', '.join(EXPORT_DTYPES)}")
    check_output_dir(out, EXPORT_COMMAND, overwrite)  # refuse before loading anything
    if overwrite:
        refuse_edited_card(out)
    src = resolve_source(checkpoint)  # refusals before any process group exists
    if src.kind != "checkpoint":
        raise CheckpointError(f"{checkpoint}: already a Hugging Face folder")
    single_process()
    family = family_named(src.shape["family"])
    if src.task is None and family.name in _folder_pairs():  # two folders: discriminator/ and generator/
        write, _, refuse = _folder_pairs()[family.name]
        state = read_ours(src.path, accept=lambda s: refuse(s, out, overwrite))  # refusals before any weight
        return write(state, out, overwrite, dtype)
    if src.task is None:
        hsd, config, tok_lower, labels = _pretraining_to_hf(src)
    else:
        hsd, config, tok_lower, labels = _task_to_hf(src, classify_dataset)
    cls = config.architectures[0]
    remote = hasattr(config, "bio_megatron_head")
    hf_model = _hf_class(cls, remote)(config)
    missing, unexpected = hf_model.load_state_dict(hsd, strict=False)
    missing = [k for k in missing if "position_ids" not in k  # tied to the word embeddings:
               and k not in ("cls.predictions.decoder.weight", "lm_head.decoder.weight")]
    if missing or unexpected:
        raise CheckpointError(f"conversion incomplete for {cls}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    hf_model.to(EXPORT_DTYPES[dtype])  # the model was built and loaded in fp32: one rounding, here
    with atomic_path(out, command=EXPORT_COMMAND, overwrite=overwrite) as tmp:
        hf_model.save_pretrained(str(tmp), safe_serialization=True)
        if remote:
            write_remote_code(tmp)
        save_tokenizer(tmp, Path(src.vocab_file), tok_lower, family)
        if labels:
            (tmp / "label_ids.csv").write_text("\n".join(labels) + "\n", encoding="utf-8")
        card = model_card(src.path, src.task, cls, remote, labels, dtype, Path(out).name)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        (tmp / "bio_megatron_export.json").write_text(json.dumps(
            {"source": str(src.path), "task": src.task, "class": cls, "remote_code": remote, "dtype": dtype,
             CARD_DIGEST_KEY: card_digest(card)}, indent=2) + "\n")
        apply_umask_modes(tmp)  # transformers writes the weights 0600: readable as the user's umask says
    log.info("exported %s -> %s (%s%s)", src.path, out, cls, ", trust_remote_code=True to load" if remote else "")
    return {"out": str(out), "class": cls, "task": src.task, "labels": labels, "remote_code": remote, "dtype": dtype}


def save_tokenizer(out: Path, vocab_file: Path, lowercase: bool | None, family: Family) -> None:
    """The tokenizer files of the exported folder: the family's (``Family.save_tokenizer``)."""
    family.save_tokenizer(out, vocab_file, lowercase)


def _folder_pairs() -> dict:
    """Families whose HF form is two folders (ELECTRA: discriminator + generator): (export of a ModelState, import,
    the export's refusals before any weight is read) functions."""
    from bio_megatron.formats.hf.electra import export_electra, import_electra, refuse_electra_export

    return {ELECTRA.name: (export_electra, import_electra, refuse_electra_export)}


def _hf_class(name: str, remote: bool) -> type:
    if remote:  # the very module the folder carries, imported here rather than from the folder
        from bio_megatron.formats.hf import modeling as hf_modeling

        return getattr(hf_modeling, name)
    import transformers

    return getattr(transformers, name)


def _task_to_hf(src: Source, classify_dataset: ClassifyDataset | None) -> tuple[dict, object, bool, list[str] | None]:
    """Encoder + head of a fine-tuned checkpoint at TP1 as an HF state and config: the family's plain task class
    when it computes the head, else (Megatron BERT only) the remote-code class."""
    if src.task == "classify":  # BLURB classification: (Megatron)BertForSequenceClassification with its problem_type
        labels, fields = classify_export_fields(src, classify_dataset)
        return state_to_hf(read_ours(src.path, default_labels=labels), fields)
    return state_to_hf(read_ours(src.path))


def _pretraining_to_hf(src: Source):
    """The pretraining model (MLM, + NSP/SOP head) of a checkpoint at TP1, converted by its family."""
    return state_to_hf(read_ours(src.path, accept=_exportable))


def _exportable(src: Source) -> None:
    """Refuse, before any weight is read, a pretraining model its family's HF class cannot compute."""
    m, _ = pretraining_config(src)
    family = family_of_model(m)
    problems = family.export_problems(m, None, binary_head=m.bert_binary_head)
    if problems:
        raise CheckpointError(f"{src.path}: a {family.name} model exports as "
                              f"{family.hf_class(None, binary_head=m.bert_binary_head)}, which cannot compute this "
                              "one: " + "; ".join(problems))


def state_to_hf(state: ModelState, config_fields: dict | None = None) -> tuple[dict, object, bool, list[str] | None]:
    """(HF state dict, transformers config, tokenizer lower-casing, labels) of a :class:`ModelState`: the family's
    plain class (pretraining, or a task head it computes), else (Megatron BERT only) the remote-code class.
    ``config_fields``: more ``config.json`` fields (a classify model's ``problem_type`` and ``finetuning_task``)."""
    m, task, family = state.model, state.task, family_named(state.family)
    tok = state.tokenizer()
    tokens = family.hf_tokens(tok)
    lower = state.lowercase if family.tokenizer_kind != "bpe" else False
    if task is None:
        binary = m.bert_binary_head
        cls = family.hf_class(None, binary_head=binary)
        problems = family.export_problems(m, None, binary_head=binary)
        if problems:
            raise CheckpointError(f"{state.source}: a {family.name} model exports as {cls}, which cannot compute "
                                  "this one: " + "; ".join(problems))
        hsd = family.to_hf(state.tensors, m, state.vocab_size, binary_head=binary, **tokens)
        return hsd, family.hf_config(m, state.vocab_size, **tokens, architectures=[cls]), lower, None
    settings = head_settings(task, m)
    if task == "classify":  # no remote-code class: transformers' own sequence class or nothing
        classify_problems(state.source, family, settings, state.shape.hidden_size)
    plain = plain_class(task, settings, state.shape.hidden_size, family) is not None
    cls = family.hf_class(task) if plain else REMOTE_CLASS[task]
    problems = family.export_problems(m, task)
    if not plain and REMOTE_MODEL_TYPE not in family.hf_model_types:  # the remote-code classes wrap MegatronBertModel
        problems.append(f"head {settings} ({family.hf_class(task)} computes "
                        + ("a 2-layer tanh head as wide as the encoder" if task == "re" else "one Linear layer")
                        + "; the remote-code classes for other heads are pre-LN Megatron BERT only)")
    if problems:
        raise CheckpointError(f"{state.source}: a {family.name} {task} model has no Hugging Face class here: {cls} "
                              "cannot compute this one: " + "; ".join(problems))
    sd = {**state.tensors, **state.head}  # a family's head map may read encoder weights too
    head = family.head_to_hf(task, sd) if plain else remote_head(sd)
    hsd = {**family.to_hf(state.tensors, m, state.vocab_size, binary_head=False, **tokens), **head}
    labels = state.labels
    extra = {"architectures": [cls]} if plain else remote_config_fields(task, settings)
    extra.update(config_fields or {})
    if labels:
        extra.update(num_labels=len(labels), id2label={i: t for i, t in enumerate(labels)},
                     label2id={t: i for i, t in enumerate(labels)})
    config = family.hf_config(m, state.vocab_size, **tokens, **extra)
    if not plain:
        from bio_megatron.formats.hf.modeling import BioMegatronConfig

        # Same fields, own model_type: loading without trust_remote_code then fails instead of silently
        # building transformers' plain head with random weights.
        fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "transformers_version")}
        config = BioMegatronConfig(**fields)
    return hsd, config, lower, labels


def import_hf(hf_dir: str | Path, out: str | Path, overwrite: bool = False, verify: bool = False,
              tolerance: float | None = None, generator: str | Path | None = None) -> dict:
    """Write a BioMegatron checkpoint (TP1, model weights only; loadable at any layout) from an HF folder.
    ``out`` must be absent or empty, or (``overwrite``) an earlier ``import hf`` output. ``verify``: the
    folder run by transformers itself vs the written checkpoint (:func:`verify_hf_import`). ``generator``:
    an ELECTRA discriminator's generator folder (:mod:`bio_megatron.formats.hf.electra`)."""
    check_output_dir(out, IMPORT_COMMAND, overwrite)  # refuse before converting anything
    src = resolve_source(hf_dir)  # refusals (activation, tokenizer, ...) before any process group exists
    if src.kind != "hf":
        raise CheckpointError(f"{hf_dir}: not a Hugging Face folder (no config.json)")
    if src.vocab_file is None:
        raise CheckpointError(f"{hf_dir}: no vocab.txt or tokenizer.json; a WordPiece vocabulary is needed beside "
                              "the weights")
    family = family_named(src.shape["family"])
    if family.name in _folder_pairs():
        return _folder_pairs()[family.name][1](src, generator, out, overwrite, verify, tolerance)
    if generator is not None:
        raise CheckpointError(f"--generator ({generator}) goes with an ELECTRA discriminator; {hf_dir} is not one")
    state = read_hf(src)
    check = (lambda tmp, _tensors: verify_hf_import(hf_dir, tmp, tolerance)) if verify else None
    # a bare encoder's fresh MLM head is seeded as a pretraining run of the default config would be
    report = write_ours(state, out, IMPORT_COMMAND, overwrite, check, fresh_head_seed=PretrainConfig().trainer.seed)
    result = {"out": str(out), "task": src.task, "labels": src.labels}
    if report is not None:
        result["verify"] = report
        if not report["verified"]:
            result["out"] = None
            return result
    log.info("imported %s -> %s (task %s)", hf_dir, out, src.task or "pretraining")
    return result


def read_hf(src: Source) -> ModelState:
    """An HF folder (``src``: its :func:`~bio_megatron.formats.source.resolve_source`) as a :class:`ModelState`:
    the family's pretraining model (its MLM head, + NSP/SOP head when the folder has one), or a task model's encoder
    and head with its labels, in our TP1 names with the real vocabulary rows."""
    from bio_megatron.config.sizes import padded_vocab_size

    tok = load_tokenizer(src.vocab_file, src.lowercase)  # WordPiece vocab.txt, byte-level BPE, SentencePiece
    single_process()
    if src.task is None:
        m = ModelConfig(**src.shape, transformer_impl="local")
    else:
        m = task_config_for_hf(src).model
        for k, v in src.shape.items():
            setattr(m, k, v)
    padded = padded_vocab_size(tok.vocab_size, m.make_vocab_size_divisible_by, 1)
    full = unpadded(read_hf_state(src.path, m.shape(), padded, src.task), tok.vocab_size)
    head = {k: v for k, v in full.items() if k.startswith("head.")}
    tensors = {k: v for k, v in full.items() if not k.startswith("head.")}
    return ModelState(tensors, m, src.shape["family"], Path(src.vocab_file), tok.vocab_size, tok.lowercase, src.task,
                      src.labels, head, {}, str(src.path))


def verify_hf_import(hf_dir: str | Path, checkpoint: str | Path, tolerance: float | None = None) -> dict:
    """transformers' own model, loaded from the folder with ``from_pretrained`` (an implementation that is
    not ours, reading the files as any user of the folder would), vs our engine on the written checkpoint:
    :func:`bio_megatron.formats.verify.verify_import` on its padded batch."""
    from bio_megatron.formats.verify import FP32_TOLERANCE, verify_import

    single_process()  # our side loads the checkpoint at TP1
    cfg = load_json(Path(hf_dir) / "config.json")
    arch = (cfg.get("architectures") or [""])[0]
    if not arch.endswith(("ForPreTraining", "ForMaskedLM", "ForTokenClassification", "ForQuestionAnswering",
                          "ForSequenceClassification")):
        raise CheckpointError(f"{hf_dir}: --verify compares output heads; architectures {arch!r} has none "
                              "(a bare encoder gets a fresh MLM head here)")
    theirs = _hf_class(arch, cfg.get("model_type") == REMOTE_MODEL_TYPE).from_pretrained(str(hf_dir)).eval()

    def reference(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        out = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
        if hasattr(out, "prediction_logits"):
            # ALBERT's sentence-order head answers where BERT's next-sentence head does
            nsp = out.sop_logits if hasattr(out, "sop_logits") else out.seq_relationship_logits
            return {"mlm": out.prediction_logits, "nsp": nsp}
        if hasattr(out, "start_logits"):  # our QA head gives [B, S, 2]
            return {"logits": torch.stack([out.start_logits, out.end_logits], dim=-1)}
        return {"mlm" if arch.endswith("ForMaskedLM") else "logits": out.logits}

    source = f"{hf_dir} via transformers {arch}.from_pretrained"
    tolerance = FP32_TOLERANCE if tolerance is None else tolerance
    if CLASS_TASK.get(arch) is None:
        return verify_import(reference, checkpoint, tolerance=tolerance, source=source)
    loaded = load_finetuned(checkpoint)

    def ours(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": loaded.model(ids, mask, types)}

    return verify_import(reference, checkpoint, tolerance=tolerance, source=source, ours=ours,
                         vocab_size=loaded.tokenizer.vocab_size, max_positions=loaded.cfg.model.max_position_embeddings,
                         num_tokentypes=loaded.cfg.model.num_tokentypes)
