"""What each NeMo key means here, as tables: ``NO_EFFECT`` (pattern, tasks, why the key changes nothing here),
``CHECKED`` (the one behaviour this project has, and why), Megatron-LM's names of NeMo's recompute keys, and the NeMo
and Megatron-LM model and tokenizer names with the vocabulary and shape each stands for. ``config/nemo_compat.py``
reads a NeMo document through them; a key NeMo adds in a release is one row here."""

from __future__ import annotations

from typing import Any

from bio_megatron.config.nemo_lightning import STRATEGY as _STRATEGY

_DATA_LOADING = "data-loader tuning; batches here are built in-process from model.micro_batch_size"
_CKPT = ("checkpoints here are every exp_manager.checkpoint_callback_params.every_n_train_steps plus the last "
         "(pretraining) and the best by dev (fine-tuning); `bio-megatron export nemo` writes .nemo archives")
_AMP = ("apex AMP level (Lightning 1.x): mixed precision here is trainer.precision, always O2-style with fp32 main "
        "weights")
_PROGRESS = "no progress bar: progress is logged every trainer.log_every_n_steps"
_GEN_QA = "used by NeMo's generative QA models only (S2SQAModel, GPTQAModel); this is BERTQAModel's head"
_PARTIAL_RECOMPUTE = ("NeMo's pipeline-window refinement of block recompute; here model.activations_checkpoint_method "
                      "block recomputes the same first layers of each stage in every micro-batch")
# Megatron-LM's names for NeMo's recompute keys (both spellings are read; setting both to different values is an
# error naming the two).
RECOMPUTE_ALIASES = {"model.recompute_granularity": "model.activations_checkpoint_granularity",
                     "model.recompute_method": "model.activations_checkpoint_method",
                     "model.recompute_num_layers": "model.activations_checkpoint_num_layers"}

# (pattern, tasks or None for all, reason). fnmatch patterns over dotted paths.
NO_EFFECT: list[tuple[str, tuple[str, ...] | None, str]] = [
    ("trainer.logger", None, "logging is set up by exp_manager here too"),
    ("trainer.enable_checkpointing", None, "checkpointing is set up by exp_manager here too"),
    ("trainer.use_distributed_sampler", None, "data-parallel sampling is megatron-core's"),
    ("trainer.benchmark", None, "cudnn.benchmark tunes convolutions; there are none"),
    ("trainer.num_sanity_val_steps", None, "no sanity validation pass before training here"),
    ("trainer.strategy", None, _STRATEGY),
    ("trainer.limit_test_batches", ("pretrain",), "pretraining runs no test pass here"),
    # PyTorch Lightning 1.x trainer keys (NeMo 1.0-1.23 configs) without a meaning here; those with one (gpus,
    # max_steps/max_epochs null, accelerator: ddp, resume_from_checkpoint) are mapped in nemo_lightning.py.
    ("trainer.replace_sampler_ddp", None, "Lightning 1.x name of use_distributed_sampler: data-parallel sampling "
                                          "is megatron-core's"),
    ("trainer.checkpoint_callback", None, "Lightning 1.x name of enable_checkpointing: checkpointing is set up by "
                                          "exp_manager here too"),
    ("trainer.amp_level", None, _AMP),
    ("trainer.amp_backend", None, _AMP),
    ("trainer.progress_bar_refresh_rate", None, _PROGRESS),
    ("trainer.enable_progress_bar", None, _PROGRESS),
    ("trainer.weights_summary", None, "the parameter count is logged at the start (and by --dry-run); no "
                                      "per-layer table"),
    ("trainer.enable_model_summary", None, "the parameter count is logged at the start (and by --dry-run); no "
                                           "per-layer table"),
    ("trainer.flush_logs_every_n_steps", None, "log lines and TensorBoard events are written as they come"),
    ("trainer.terminate_on_nan", None, "a non-finite loss skips its step; trainer.max_nonfinite_steps in a row "
                                       "stop the run"),
    ("trainer.detect_anomaly", None, "autograd anomaly detection is a debugging aid; not enabled here"),
    ("trainer.sync_batchnorm", None, "BERT has no batch norm"),
    ("trainer.auto_select_gpus", None, "each rank's GPU is its LOCAL_RANK"),
    ("trainer.plugins", None, "Lightning plugins: precision and the parallel layout are megatron-core's"),
    ("trainer.distributed_backend", None, _STRATEGY),
    ("trainer.move_metrics_to_cpu", None, "metrics are gathered on the CPU here"),
    ("trainer.prepare_data_per_node", None, "each rank reads its data in-process"),
    ("trainer.log_gpu_memory", None, "the memory estimate is logged before the run (and by --dry-run)"),
    ("trainer.resume_from_checkpoint", None, "null: nothing to resume (exp_manager.resume_if_exists resumes a "
                                             "preempted run)"),
    ("trainer.max_epochs", ("pretrain",), "pretraining is step-based: it stops at trainer.max_steps"),
    ("exp_manager.resume_ignore_no_checkpoint", None, "a run without a checkpoint to resume starts fresh here"),
    ("exp_manager.create_checkpoint_callback", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.monitor", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.save_top_k", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.mode", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.always_save_nemo", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.filename", None, _CKPT),
    ("exp_manager.checkpoint_callback_params.model_parallel_size", None, _CKPT),
    ("model.mcore_bert", None, "the encoder is always megatron-core's BertModel here"),
    ("model.add_pooler", None, "the pooler exists exactly when model.bert_binary_head is true (megatron-core)"),
    ("model.apply_query_key_layer_scaling", None, "numerics only: the 1/layer scaling is undone in the fp32 softmax"),
    ("model.pre_process", None, "set per pipeline stage by the engine"),
    ("model.post_process", None, "set per pipeline stage by the engine"),
    ("model.megatron_amp_O2", None, "mixed precision here is always O2-style: bf16/fp16 weights with fp32 main "
                                    "weights in megatron-core's optimizer (trainer.precision chooses the dtype)"),
    ("model.grad_allreduce_chunk_size_mb", None, "gradient bucketing is megatron-core DDP's"),
    ("model.grad_div_ar_fusion", None, "gradient bucketing is megatron-core DDP's"),
    ("model.gradient_as_bucket_view", None, "gradient bucketing is megatron-core DDP's"),
    ("model.use_cpu_initialization", None, "weights come from the engine's seeded init (the same at every layout)"),
    ("model.onnx_safe", None, "no ONNX export here"),
    ("model.num_micro_batches_with_partial_activation_checkpoints", None, _PARTIAL_RECOMPUTE),
    ("model.data.skip_warmup", None, "mmap page warm-up: I/O only"),
    ("model.data.num_workers", None, _DATA_LOADING),
    ("model.data.reset_position_ids", None, "GPT option; NeMo's BERT dataset ignores it too"),
    ("model.data.reset_attention_mask", None, "GPT option; NeMo's BERT dataset ignores it too"),
    ("model.data.eod_mask_loss", None, "GPT option; NeMo's BERT dataset ignores it too"),
    ("model.dataset.num_workers", None, _DATA_LOADING),
    ("model.dataset.pin_memory", None, _DATA_LOADING),
    ("model.dataset.drop_last", None, _DATA_LOADING),
    ("model.dataset.use_cache", None, "tokenised features are not cached to disk here"),
    ("model.dataset.do_lower_case", None, "lower-casing follows the tokenizer (model.tokenizer.do_lower_case), as "
                                          "in NeMo with a pretrained tokenizer"),
    ("model.dataset.num_classes", ("re",), "the classes are the labels found in the data files"),
    ("model.dataset.num_classes", ("classify",), "the classes are model.dataset.task_name's label set"),
    ("model.dataset.check_if_answer_in_context", None, _GEN_QA),
    ("model.*_ds.num_workers", None, _DATA_LOADING),
    ("model.*_ds.pin_memory", None, _DATA_LOADING),
    ("model.*_ds.drop_last", None, _DATA_LOADING),
    ("model.validation_ds.batch_size", None, "evaluation batch size; results are the same"),
    ("model.test_ds.batch_size", None, "evaluation batch size; results are the same"),
    ("model.class_labels.class_labels_file", None, "the label map is always saved as label_ids.csv with the model"),
    ("model.label_ids", None, "filled from the training labels"),
    ("model.nemo_path", None, "`bio-megatron export nemo` writes .nemo archives"),
    ("model.save_model", None, _CKPT),
    ("model.infer_samples", None, "use `bio-megatron predict`"),
    ("model.library", ("qa",), _GEN_QA),
    ("model.tokens_to_generate", ("qa",), _GEN_QA),
    ("model.token_classifier.num_classes", ("ner",), "the labels come from the training data"),
    ("model.tokenizer.special_tokens", None, "BERT's [CLS] [SEP] [MASK] [PAD] [UNK] from the vocabulary"),
    ("model.optim.sched.monitor", None, "used by ReduceLROnPlateau only; the schedule steps every optimizer step"),
    ("model.optim.sched.max_steps", None, "computed from trainer.max_steps (or max_epochs), as NeMo does"),
    ("hydra.*", None, "Hydra's own settings; this CLI does not run Hydra"),
]

# (path, allowed values, why only these). Anything else is an error that lists the allowed values.
CHECKED: dict[str, tuple[tuple[Any, ...], str]] = {
    "model.position_embedding_type": (("learned_absolute",), "Megatron BERT's learned absolute positions"),
    "model.normalization": (("layernorm",), "Megatron BERT's LayerNorm"),
    "model.kv_channels": ((None,), "always hidden_size / num_attention_heads"),
    "model.add_lm_head": ((True,), "pretraining trains the masked-LM head"),
    "model.megatron_legacy": ((False,), "the encoder is megatron-core's; import legacy weights with "
                                        "`bio-megatron import megatron-lm|nemo`"),
    "model.virtual_pipeline_model_parallel_size": ((None, 1), "no interleaved pipeline schedule here"),
    "model.activations_checkpoint_layers_per_pipeline": ((None,), "block recompute takes the same "
                                                          "activations_checkpoint_num_layers on every pipeline stage"),
    "model.fp32_residual_connection": ((False,), "residuals stay in the compute dtype"),
    "model.fp16_lm_cross_entropy": ((False,), "the LM loss is computed in fp32"),
    "model.tokenizer.model": ((None,), "a SentencePiece model needs model.tokenizer.library=sentencepiece"),
    "model.tokenizer.tokenizer_model": ((None,), "a SentencePiece model needs model.tokenizer.library=sentencepiece"),
    "model.tokenizer.merge_file": ((None,), "WordPiece vocabularies only (no BPE merges)"),
    "model.data.data_impl": (("mmap",), "megatron-core's indexed .bin/.idx datasets"),
    "model.data.dataloader_type": (("single",), "samples are read in megatron-core's (pre-shuffled) order"),
    "model.optim.sched.last_epoch": ((-1,), "schedules start at step 0; resume restores their state"),
    "model.optim.sched.reduce_on_plateau": ((False,), "no ReduceLROnPlateau here"),
    "pretrained_model": ((None,), "import a .nemo with `bio-megatron import nemo`, then model.restore_from_path"),
    "do_training": ((True,), "evaluate a trained model with `bio-megatron evaluate` or `predict`"),
    "model.language_model.config_file": ((None,), "give the shape with model.num_layers, hidden_size, ..."),
    "model.language_model.config": ((None,), "give the shape with model.num_layers, hidden_size, ..."),
    "model.language_model.nemo_file": ((None,), "import a .nemo with `bio-megatron import nemo`, then "
                                                "model.restore_from_path"),
    "model.dataset.keep_doc_spans": (("all",), "every document span is kept, as NeMo's default"),
    "model.token_classifier.log_softmax": ((False,), "the loss normalises the logits itself"),
    "model.train_ds.shuffle": ((True,), "training batches are shuffled every epoch"),
    "model.validation_ds.shuffle": ((False,), "evaluation reads the data in order"),
    "model.test_ds.shuffle": ((False,), "evaluation reads the data in order"),
}

# NeMo tokenizer / encoder names -> (our built-in vocabulary or None, lower-case, encoder shape).
_BASE = {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "ffn_hidden_size": 3072,
         "transformer_block_type": "post_ln"}
_LARGE = {"num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
          "transformer_block_type": "post_ln"}
_M345 = {"size": "345m", "transformer_block_type": "pre_ln"}
KNOWN_MODELS: dict[str, tuple[str | None, bool, dict]] = {
    "bert-base-uncased": ("bert_base_uncased", True, _BASE),
    "bert-base-cased": ("bert_base_cased", False, _BASE),
    "bert-large-uncased": ("bert_base_uncased", True, _LARGE),  # the same WordPiece vocabulary as base
    "bert-large-cased": ("bert_base_cased", False, _LARGE),
    "megatron-bert-345m-uncased": ("bert_base_uncased", True, _M345),
    "megatron-bert-345m-cased": ("bert_base_cased", False, _M345),
    "biomegatron-bert-345m-uncased": (None, True, _M345),  # NGC's vocab file: give model.tokenizer.vocab_file
    "biomegatron-bert-345m-cased": (None, False, _M345),
}
MEGATRON_TOKENIZERS = {"BertWordPieceLowerCase": ("bert_base_uncased", True),
                       "BertWordPieceCase": ("bert_base_cased", False)}
