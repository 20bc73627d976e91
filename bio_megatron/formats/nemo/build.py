"""Our side of ``import nemo`` / ``export nemo``: a read archive as a ``ModelState`` (which ``formats/ours.py``'s
``write_ours`` saves), a checkpoint loaded for export, and NeMo's ``model_config.yaml`` (key names of NeMo 2.4's
``megatron_bert_config.yaml`` and of the task models' configs, as ``MegatronBertModel.model_provider_func``
and the task models' ``__init__`` read them)."""

from __future__ import annotations

from pathlib import Path

import torch

from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.formats.state import ModelState, unpadded
from bio_megatron.utils.errors import CheckpointError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
# The NeMo class each model restores as (``model_config.yaml``'s ``target``), by task (None: pretraining).
_PKG = "nemo.collections.nlp.models."
TARGETS = {None: _PKG + "language_modeling.megatron_bert_model.MegatronBertModel",
           "ner": _PKG + "token_classification.token_classification_model.TokenClassificationModel",
           "qa": _PKG + "question_answering.qa_bert_model.BERTQAModel",  # what qa_conf.yaml configures
           "re": _PKG + "text_classification.text_classification_model.TextClassificationModel"}
_ENCODER = ("embedding.", "encoder.")


def _apply_settings(m, settings: dict) -> None:
    for key, value in settings.items():
        if isinstance(value, dict):
            for k, v in value.items():
                setattr(getattr(m, key), k, v)
        else:
            setattr(m, key, value)


def _dataset_from_nemo(m, task: str, cfg: dict, positions: int, where: str) -> None:
    """NeMo's ``model.dataset`` settings that mean the same here (QA's windows and n-best decide the answers)."""
    nemo_dataset = cfg.get("dataset") if isinstance(cfg.get("dataset"), dict) else {}
    for key in DATASET_KEYS[task]:
        if nemo_dataset.get(key) is not None:
            setattr(m.dataset, key, nemo_dataset[key])
    if m.dataset.max_seq_length > positions:  # e.g. our QA default (384) when the archive has no dataset block
        log.warning("%s: max_seq_length %d exceeds the encoder's %d positions: using %d", where,
                    m.dataset.max_seq_length, positions, positions)
        m.dataset.max_seq_length = positions


def state_of_archive(src: dict, scratch: Path) -> ModelState:
    """What :func:`~bio_megatron.formats.nemo.convert.read_archive` read from an archive, as a :class:`ModelState`
    (the vocabulary written to ``scratch/vocab.txt``, which must outlive the state's use): the pretraining model
    (``ModelConfig``) or the task model's encoder + head in the task config's model section, with NeMo's head and
    dataset settings. CheckpointError for a vocabulary that does not fit the embedding."""
    from bio_megatron.config.finetune import CONFIG_CLASSES
    from bio_megatron.config.pretrain import ModelConfig
    from bio_megatron.vocab.wordpiece import WordPieceTokenizer

    where, state, shape, task = src["where"], src["state"], src["shape"], src["task"]
    vocab_file = scratch / "vocab.txt"
    vocab_file.write_text(src["vocab_text"], encoding="utf-8")
    tok = WordPieceTokenizer(vocab_file, src["lower"])
    rows, divisible = state["embedding.word_embeddings.weight"].shape[0], src["divisible"]
    expected = padded_vocab_size(tok.vocab_size, divisible, src["tp"])
    if rows < tok.vocab_size or (src["layout"] == "legacy" and rows != expected):
        raise CheckpointError(f"{where}: the embedding has {rows} rows, but the vocabulary has {tok.vocab_size} "
                              f"entries, which NeMo pads to {expected} (multiple of {divisible} x TP {src['tp']})")
    full = unpadded({k: v for k, v in state.items() if torch.is_tensor(v)}, tok.vocab_size)
    if "embedding.tokentype_embeddings.weight" not in full:  # NeMo without binary head has none: zeros add nothing
        full["embedding.tokentype_embeddings.weight"] = torch.zeros(2, shape["hidden_size"])
    if task is None:
        binary = "binary_head.weight" in full
        if not binary and "pooler.dense.weight" in full:  # NeMo's add_pooler default; unused without the head
            full = {k: v for k, v in full.items() if not k.startswith("pooler.")}
        if "lm_head.dense.weight" not in full:  # an encoder-only archive: fine-tuning uses the encoder alone
            log.warning("%s has no LM head: the imported LM head is freshly initialised", where)
        m = ModelConfig(**shape, bert_binary_head=binary, transformer_impl="local",
                        make_vocab_size_divisible_by=divisible, encoder_seq_length=shape["max_position_embeddings"])
    else:
        m = CONFIG_CLASSES[task]().model
        for k, v in shape.items():
            setattr(m, k, v)
        m.transformer_impl, m.make_vocab_size_divisible_by = "local", divisible
        _apply_settings(m, src["settings"])
        _dataset_from_nemo(m, task, src["cfg"], shape["max_position_embeddings"], where)
        full = {k: v for k, v in full.items() if k.startswith(_ENCODER)}
    origin = {"nemo": {"tp": src["tp"], "pp": src["pp"], "layout": src["layout"], "target": src["cfg"].get("target")}}
    return ModelState(full, m, "megatron_bert", vocab_file, tok.vocab_size, tok.lowercase, task, src["labels"],
                      dict(src["head"]) if task is not None else {}, {}, where, origin)


def load_for_export(checkpoint: str | Path) -> ModelState:
    """Our checkpoint (pretraining or fine-tuned, any saved layout) at TP1, refused unless NeMo's Megatron BERT
    holds it (pre-LN megatron_bert: NeMo's post_ln block is another model)."""
    from bio_megatron.formats.ours import read_ours
    from bio_megatron.formats.megatron_lm.convert import megatron_bert_only

    return read_ours(checkpoint, accept=megatron_bert_only("NeMo's Megatron BERT"))


def _bert_config(ours: ModelState, tp: int, pp: int, mcore: bool, vocab_ref: str, binary: bool) -> dict:
    """A ``MegatronBertModel`` config (NeMo 2.4's ``megatron_bert_config.yaml`` names)."""
    s, m = ours.shape, ours.model
    return {
        "mcore_bert": mcore, "micro_batch_size": 4, "global_batch_size": 8 * tp * pp,
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": None,
        "encoder_seq_length": m.max_position_embeddings, "max_position_embeddings": m.max_position_embeddings,
        "position_embedding_type": "learned_absolute", "num_layers": s.num_layers, "hidden_size": s.hidden_size,
        "ffn_hidden_size": s.ffn_hidden_size, "num_attention_heads": s.num_attention_heads,
        "init_method_std": m.init_method_std, "hidden_dropout": 0.1, "attention_dropout": 0.1, "kv_channels": None,
        "apply_query_key_layer_scaling": False, "layernorm_epsilon": m.layernorm_epsilon,
        "make_vocab_size_divisible_by": m.make_vocab_size_divisible_by, "pre_process": True, "post_process": True,
        "bert_binary_head": binary, "add_pooler": binary, "megatron_legacy": False,
        "transformer_block_type": "pre_ln", "normalization": "layernorm", "activation": "gelu",
        "openai_gelu": False, "onnx_safe": False, "bias_gelu_fusion": True, "bias_dropout_add_fusion": True,
        "masked_softmax_fusion": True, "share_embeddings_and_output_weights": True,
        "tokenizer": {"library": "megatron",
                      "type": "BertWordPieceLowerCase" if ours.lowercase else "BertWordPieceCase",
                      "model": None, "vocab_file": vocab_ref, "merge_file": None},
        "native_amp_init_scale": 4294967296, "native_amp_growth_interval": 1000, "fp32_residual_connection": False,
        "fp16_lm_cross_entropy": False, "megatron_amp_O2": False, "grad_allreduce_chunk_size_mb": 125,
        "grad_div_ar_fusion": False, "seed": 1234, "use_cpu_initialization": False,
        "gradient_as_bucket_view": True, "sequence_parallel": False, "precision": 32,
        "data": {"data_prefix": [], "index_mapping_dir": None, "data_impl": "mmap", "splits_string": "949,50,1",
                 "seq_length": m.max_position_embeddings, "skip_warmup": True, "num_workers": 0,
                 "dataloader_type": "single", "reset_position_ids": False, "reset_attention_mask": False,
                 "eod_mask_loss": False, "masked_lm_prob": 0.15, "short_seq_prob": 0.1},
        "optim": {"name": "fused_adam", "lr": 2e-4, "weight_decay": 0.01, "betas": [0.9, 0.98],
                  "sched": {"name": "CosineAnnealing", "warmup_steps": 500, "constant_steps": 50000, "min_lr": 2e-5}},
    }


# ``model.dataset`` keys that mean the same in NeMo's task model and ours (``predict`` reads them: QA's windows
# and n-best settings change the answers), and the ones NeMo's ``__init__``/inference read that we have no use
# for, with the value NeMo's example configs give them.
DATASET_KEYS = {"ner": ("max_seq_length", "pad_label", "ignore_extra_tokens", "ignore_start_end", "class_balancing"),
                "re": ("max_seq_length", "class_balancing"),
                "qa": ("version_2_with_negative", "doc_stride", "max_query_length", "max_seq_length",
                       "max_answer_length", "n_best_size", "null_score_diff_threshold")}
_NEMO_ONLY = {"ner": {"num_workers": 2, "pin_memory": False, "use_cache": False},
              "re": {"use_cache": False},
              "qa": {"use_cache": False, "keep_doc_spans": "all", "check_if_answer_in_context": True}}


def _dataset_config(ours: ModelState) -> dict:
    d, task = ours.model.dataset, ours.task
    out = {"do_lower_case": ours.lowercase, **{k: getattr(d, k) for k in DATASET_KEYS[task]}, **_NEMO_ONLY[task]}
    if task == "re":
        out["num_classes"] = len(ours.labels or [])
    return out


def head_caveats(ours: ModelState) -> list[str]:
    """Why NeMo 2.4 would not rebuild this head as it is (empty: it does). NeMo's ``MultiLayerPerceptron``
    (``nemo/collections/common/parts/multi_layer_perceptron.py``) makes every hidden layer
    ``Linear(hidden_size, hidden_size)`` and takes its activation as ``getattr(torch, activation)``;
    ``TextClassificationModel`` passes ``activation='relu'`` whatever the config says."""
    task, s = ours.task, ours.head_settings
    if task is None:
        return []
    layers = s["num_output_layers"] if task == "re" else s["num_fc_layers"]
    if layers < 2:
        return []  # one Linear: neither the width nor the activation exists
    out = []
    hidden, width = ours.shape.hidden_size, getattr(ours.model, "fc_hidden_size", None)
    if width not in (None, hidden):
        out.append(f"fc_hidden_size {width} differs from the encoder's hidden_size {hidden}: NeMo's "
                   "MultiLayerPerceptron sizes every hidden layer by the encoder, so restore_from fails on the "
                   "classifier's shapes")
    if task == "re" and s["activation"] != "relu":
        out.append(f"classifier_head.activation {s['activation']!r}: NeMo's TextClassificationModel always uses "
                   "relu, so NeMo's logits would differ (import nemo reads it back as written)")
    elif s["activation"] not in ("relu", "tanh"):
        out.append(f"activation {s['activation']!r}: NeMo's MultiLayerPerceptron looks it up as torch."
                   f"{s['activation']}, which does not exist, so restore_from fails")
    return out


def nemo_config(ours: ModelState, tp: int, pp: int, mcore: bool, vocab_ref: str, labels_ref: str | None) -> dict:
    """``model_config.yaml`` for a pretraining model (MegatronBertModel) or a task model around one."""
    task = ours.task
    if task is None:
        cfg = _bert_config(ours, tp, pp, mcore, vocab_ref, ours.binary_head)
        return {**cfg, "target": TARGETS[None], "nemo_version": "2.4.0"}
    # The encoder keeps its token-type table, which NeMo builds only together with the binary head.
    encoder = _bert_config(ours, tp, pp, mcore, vocab_ref, True)
    s = ours.head_settings
    cfg = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
           "tokenizer": {"tokenizer_name": "megatron-bert-uncased" if ours.lowercase else "megatron-bert-cased",
                         "vocab_file": vocab_ref, "tokenizer_model": None, "special_tokens": None},
           "language_model": {"pretrained_model_name": "megatron-bert-345m-uncased", "lm_checkpoint": None,
                              "config_file": None, "config": encoder, "do_lower_case": ours.lowercase}}
    if task == "re":
        cfg["classifier_head"] = {"num_output_layers": s["num_output_layers"], "fc_dropout": s["fc_dropout"],
                                  "activation": s["activation"], "use_transformer_init": s["use_transformer_init"]}
    elif task == "qa":  # BERTQAModel reads num_classes from here (2: start and end logits)
        cfg["token_classifier"] = {"num_layers": s["num_fc_layers"], "dropout": s["fc_dropout"], "num_classes": 2,
                                   "activation": s["activation"], "log_softmax": False,
                                   "use_transformer_init": s["use_transformer_init"]}
    else:
        cfg["head"] = {k: s[k] for k in ("num_fc_layers", "fc_dropout", "activation", "use_transformer_init")}
    cfg["dataset"] = _dataset_config(ours)
    if ours.labels:
        cfg["label_ids"] = {label: i for i, label in enumerate(ours.labels)}
        cfg["class_labels"] = {"class_labels_file": labels_ref}
    return {**cfg, "target": TARGETS[task], "nemo_version": "2.4.0"}


__all__ = ["DATASET_KEYS", "head_caveats", "load_for_export", "nemo_config", "state_of_archive"]
