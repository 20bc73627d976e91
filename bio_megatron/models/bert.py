"""Megatron BERT on megatron-core: TransformerConfig, layer spec choice and the model itself.

Spec choice: Transformer Engine's spec when TE is importable on a GPU (the DGX image), otherwise
megatron-core's local spec; on GPU the local spec's attention is swapped for ``SDPACoreAttention`` so
attention never falls back to the unfused path there. ``model.transformer_block_type: post_ln`` turns the
local spec into the original BERT layer order (:mod:`bio_megatron.models.post_ln`).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import warnings

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from megatron.core.models.bert.bert_model import BertModel
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from bio_megatron.config.pretrain import ModelConfig
from bio_megatron.config.sizes import padded_vocab_size
from bio_megatron.models.init import on_device
from bio_megatron.models.attention import (SDPACoreAttention, is_packed, packed_attention_mask,
                                          packed_position_ids)
from bio_megatron.models.post_ln import (add_embedding_layernorm, drop_final_layernorm, is_post_ln,
                                         post_ln_layer_spec)
from bio_megatron.models.sequence_parallel import fallback_norms, sequence_parallel_spec
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # ImportError, or a broken TE build
        return False
    return True


def precision_dtype(precision: str | int) -> torch.dtype:
    """The compute dtype for a NeMo-style precision flag, the same on CPU as on GPU (``bf16``/``bf16-mixed``:
    bfloat16, ``16``/``16-mixed``: float16, ``32``: float32), so that the half-precision path a GPU run takes
    (``Float16Module``, fp32 main parameters, loss scaling) is the one CPU tests exercise."""
    p = str(precision)
    if p.startswith("bf16"):
        return torch.bfloat16
    if p.startswith("16"):
        if not torch.cuda.is_available():
            _warn_cpu_float16()
        return torch.float16
    return torch.float32


@functools.cache
def _warn_cpu_float16() -> None:
    # NeMo's configs say precision: 16 for GPUs; run as they are on a CPU they crawl. Measured on this project's
    # 2-core AMD EPYC (torch 2.15, one thread, a [512 x 768] x [768 x 3072] matmul): float16 1.6 GFLOP/s, float32
    # 96, bfloat16 460; a 12 x 768 BERT step in float16 ran at 6 tokens/s.
    log.warning("trainer.precision=16 without a GPU: most CPUs have no fast float16 matrix kernels (60x slower than "
                "float32 on an AMD EPYC), so this run will be very slow; on a CPU use trainer.precision=32, or bf16 "
                "where the CPU has bfloat16 instructions")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16`` (as written to metrics.jsonl and checkpoints)."""
    return str(dtype).removeprefix("torch.")


def describe_precision(dtype: torch.dtype) -> str:
    """The compute dtype for the start-of-run log line, with what goes with it."""
    if dtype == torch.float32:
        return "float32"
    scaling = ", dynamic loss scaling" if dtype == torch.float16 else ""
    return f"{dtype_name(dtype)} (fp32 main parameters and gradient reduction{scaling})"


def recompute_settings(m: ModelConfig) -> dict:
    """NeMo's ``activations_checkpoint_*`` keys as megatron-core's ``recompute_*`` fields (checked beforehand by
    ``bio_megatron.config.scale.recompute_problems``)."""
    g = m.activations_checkpoint_granularity
    if g is None:
        return {}
    if g == "full":
        return dict(recompute_granularity="full", recompute_method=m.activations_checkpoint_method,
                    recompute_num_layers=m.activations_checkpoint_num_layers)
    # Selective: megatron-core's core_attn only. In 0.19.2 its other dense-layer options fail here: "mlp" hands the
    # fc2 bias Parameter out of its CheckpointFunction (BERT's linears have biases), which then recurses in the
    # backward; "layernorm" needs Transformer Engine (CheckpointWithoutOutput reads its FP8 state).
    return dict(recompute_granularity="selective", recompute_modules=["core_attn"])


def transformer_config(m: ModelConfig, dtype: torch.dtype = torch.float32) -> TransformerConfig:
    s = m.shape()
    on_gpu = torch.cuda.is_available()
    with warnings.catch_warnings():
        # Selective recompute warns that Transformer Engine's fused attention needs no core_attn recompute; the
        # local spec's attention is unfused (or SDPA), where it is what saves the [b, n, s, s] activations.
        warnings.filterwarnings("ignore", message="If you are using transformer_engine")
        return _transformer_config(m, s, on_gpu, dtype)


def _have_fused_softmax() -> bool:
    return importlib.util.find_spec("scaled_masked_softmax_cuda") is not None


def _transformer_config(m: ModelConfig, s, on_gpu: bool, dtype: torch.dtype) -> TransformerConfig:
    return TransformerConfig(
        num_layers=s.num_layers, hidden_size=s.hidden_size, ffn_hidden_size=s.ffn_hidden_size,
        num_attention_heads=s.num_attention_heads,
        tensor_model_parallel_size=m.tensor_model_parallel_size,
        pipeline_model_parallel_size=m.pipeline_model_parallel_size,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        layernorm_epsilon=m.layernorm_epsilon, init_method_std=m.init_method_std,
        activation_func=F.gelu,  # exact (erf) GELU, as Megatron BERT and HF MegatronBert use
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        # Weights are initialised by bio_megatron.models.init (identically for every layout).
        perform_initialization=False, use_cpu_initialization=not on_gpu,
        # megatron's fused bias-GELU (fusions/fused_bias_gelu.py) is the tanh approximation: fused, a GPU would train
        # another activation than the CPU and than the HF checkpoints we import. Its fused masked softmax needs
        # the compiled scaled_masked_softmax_cuda (Apex-built), which megatron imports unguarded when it checks a
        # shape: on a GPU without it, the unfused attention of bf16/fp16 runs would die on ModuleNotFoundError.
        bias_activation_fusion=False, masked_softmax_fusion=on_gpu and _have_fused_softmax(),
        gradient_accumulation_fusion=False, bias_dropout_fusion=bool(m.bias_dropout_add_fusion),
        apply_query_key_layer_scaling=False, attention_softmax_in_fp32=True,
        # TP1 has no sequence to split: a checkpoint's sequence_parallel is dropped where it is built at TP1
        # (exports, verification); pretraining refuses sequence_parallel with TP1 in its config check.
        sequence_parallel=m.sequence_parallel and m.tensor_model_parallel_size > 1,
        **recompute_settings(m),
    )


def layer_spec(m: ModelConfig) -> ModuleSpec:
    impl = m.transformer_impl
    on_gpu = torch.cuda.is_available()
    post_ln = m.transformer_block_type == "post_ln"
    if post_ln and impl == "transformer_engine":
        raise ConfigError("model.transformer_block_type=post_ln needs model.transformer_impl local or auto: "
                          "Transformer Engine's BERT spec fuses each LayerNorm into the next linear (pre-LN only)")
    if post_ln:
        return _with_sequence_parallel(m, post_ln_layer_spec(_local_spec(m, on_gpu)))
    # Packed rows need the per-document [b, 1, s, s] mask, which Transformer Engine's BERT spec does not take: auto
    # then builds the local spec (SDPA on GPU); an explicit transformer_engine is refused at config time.
    packed = getattr(m.data, "packing", None) or getattr(getattr(m, "dataset", None), "packing", False)
    if impl == "transformer_engine" or (impl == "auto" and on_gpu and have_transformer_engine() and not packed):
        if not have_transformer_engine():
            raise ConfigError("model.transformer_impl=transformer_engine but Transformer Engine is not importable")
        from megatron.core.models.bert.bert_layer_specs import get_bert_layer_with_transformer_engine_spec

        return get_bert_layer_with_transformer_engine_spec()
    return _with_sequence_parallel(m, _local_spec(m, on_gpu))


def _with_sequence_parallel(m: ModelConfig, spec: ModuleSpec) -> ModuleSpec:
    """The local spec's PyTorch LayerNorms refuse sequence parallelism; give them megatron's SP tags instead."""
    sp = m.sequence_parallel and m.tensor_model_parallel_size > 1
    return sequence_parallel_spec(spec) if sp else spec


def _local_spec(m: ModelConfig, on_gpu: bool) -> ModuleSpec:
    backend = m.attention_backend if m.attention_backend != "auto" else ("sdpa" if on_gpu else "unfused")
    if backend == "unfused":
        return bert_layer_local_spec
    spec = copy.deepcopy(bert_layer_local_spec)
    spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec


class _FillPaddedVocab(torch.autograd.Function):
    """Set the logits' last columns from ``start`` on to -inf in place; the gradient passes through unchanged.

    A clone plus slice assignment (the obvious version) copies the [s, b, V] logits in the forward and makes
    autograd copy their gradient in the backward: two passes over ~125 MB per step at the tiny shape, half of
    its forward+backward on CPU. Passing the gradient through is exact: the loss reads the logits only through
    a softmax, and softmax(-inf) = +0.0, so the loss gradient in the filled columns is already +0.0 -- the
    value the slice assignment's backward would write (``tests/parallel/test_mask_padded_vocab.py`` compares
    loss and gradients bit for bit against the clone version, at TP1 and TP2)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, start: int) -> torch.Tensor:
        ctx.mark_dirty(logits)
        logits[..., start:] = float("-inf")
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def mask_padded_vocab(logits: torch.Tensor, true_vocab_size: int) -> torch.Tensor:
    """This rank's slice of vocab-parallel logits with the padding entries (ids >= ``true_vocab_size``) at -inf,
    written into ``logits`` itself (the output layer's fresh result, which nothing else holds)."""
    per_rank = logits.shape[-1]
    n_real = true_vocab_size - ps.get_tensor_model_parallel_rank() * per_rank
    if n_real >= per_rank:
        return logits
    return _FillPaddedVocab.apply(logits, max(n_real, 0))


class BioBertModel(BertModel):
    """megatron-core BertModel that also accepts ``SDPACoreAttention`` in the local spec and keeps the
    vocabulary padding out of the softmax.

    Megatron pads the vocabulary to a multiple of 128 x TP, and its padded entries would otherwise take
    part in the softmax: the loss would then depend on the TP size, and the model could predict tokens that
    do not exist. Masking them makes losses identical across layouts and logits equal to an unpadded model.

    With a post-LN layer spec it is the original BERT: embedding LayerNorm, no final LayerNorm. The LM head
    (dense, GELU, LayerNorm), pooler and binary head are the same in both families (as in HF
    ``BertForPreTraining`` and ``MegatronBertForPreTraining``).
    """

    def __init__(self, *args, true_vocab_size: int | None = None, **kwargs):
        with fallback_norms(kwargs["config"]):  # the final and MLM-head LayerNorms, with sequence parallelism
            super().__init__(*args, **kwargs)
        if is_post_ln(self.transformer_layer_spec):
            drop_final_layernorm(self.encoder)
            if self.pre_process:
                add_embedding_layernorm(self.embedding)
        self.true_vocab_size = true_vocab_size
        if self.post_process and true_vocab_size is not None and true_vocab_size < self.vocab_size:
            self.output_layer.register_forward_hook(self._mask_padded_vocab)

    def bert_extended_attention_mask(self, attention_mask: torch.Tensor) -> torch.Tensor | None:
        # megatron's forward calls this before bert_position_ids(input_ids), which sees the token ids only: a
        # packed batch's restarting positions are kept here for it (and cleared for every other batch).
        self._packed_positions = None
        if is_packed(attention_mask):  # documents packed per row (data/packing.py): block-diagonal, both backends
            self._packed_positions = packed_position_ids(attention_mask)
            return packed_attention_mask(attention_mask)
        core = self.transformer_layer_spec.submodules.self_attention.submodules.core_attention
        if core is SDPACoreAttention and bool(attention_mask.all()):
            return None  # nothing to mask: SDPA's flash kernel needs no mask at all
        return super().bert_extended_attention_mask(attention_mask)

    def bert_position_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        packed = getattr(self, "_packed_positions", None)
        return packed if packed is not None else super().bert_position_ids(token_ids)

    def _mask_padded_vocab(self, module, inputs, output):
        logits, bias = output
        return mask_padded_vocab(logits, self.true_vocab_size), bias

    def _sanity_check_attention_and_get_attn_mask_dimension(self) -> str:
        core = self.transformer_layer_spec.submodules.self_attention.submodules.core_attention
        if core is SDPACoreAttention:
            # Key-padding mask [b, 1, 1, s]: no fully-masked rows, and SDPA broadcasts it over queries.
            return "b11s"
        return super()._sanity_check_attention_and_get_attn_mask_dimension()


def build_model(m: ModelConfig, vocab_size: int, dtype: torch.dtype = torch.float32,
                pre_process: bool | None = None, post_process: bool | None = None) -> BioBertModel:
    """This rank's stage of the model (weights NOT initialised: call ``init_weights``)."""
    cfg = transformer_config(m, dtype)
    padded = padded_vocab_size(vocab_size, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size)
    model = BioBertModel(
        config=cfg, transformer_layer_spec=layer_spec(m), vocab_size=padded,
        max_sequence_length=m.max_position_embeddings, num_tokentypes=m.num_tokentypes,
        add_binary_head=m.bert_binary_head, share_embeddings_and_output_weights=True,
        parallel_output=True, true_vocab_size=vocab_size,
        pre_process=ps.is_pipeline_first_stage() if pre_process is None else pre_process,
        post_process=ps.is_pipeline_last_stage() if post_process is None else post_process,
    )
    return on_device(model, dtype)
