"""Gradient-accumulation fusion: weight gradients written straight into megatron DDP's gradient buffer.

megatron-core's DDP keeps every parameter's gradient in one flat buffer (``param.main_grad``). Unfused, each
linear's weight gradient is a fresh tensor that DDP's backward hook then adds into the buffer, and the word
embedding's gradient is a dense [vocabulary, hidden] tensor of zeros with the batch's rows added in (what
``F.embedding``'s backward builds) that is added in the same way. At 345m that is ~1.5 GB of fresh memory and
as many extra passes per step, and on the CPU fresh blocks that large come from ``mmap``: every page is
faulted in and zeroed by the kernel again each step. Measured at 345m, one thread: the fc2 weight gradients
took 4x HF's time for the same matmul, the embedding's zeros 0.4 s of a 4.9 s step; in bf16, DDP's
``main_grad.add_(bf16 gradient)`` first converts the gradient into a fresh fp32 temporary, 1.1 s per step.

megatron-core has the fused path built in (``gradient_accumulation_fusion``, on by default in Megatron-LM):
the linear's backward calls apex's ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``, which adds the
weight gradient GEMM into ``main_grad``, and hands autograd an unused placeholder. Without apex megatron
refuses the flag. This module:

* gives megatron-core's linears a CPU kernel for it (:func:`wgrad_gemm_accum_fp32`: one ``addmm_`` into
  ``main_grad`` for fp32, a bf16/fp16 GEMM added in for half precision: what the unfused hook adds);
* does the same for the vocab-parallel word embedding (:class:`_EmbeddingIntoMainGrad`: the batch's rows
  ``index_add_``-ed into ``main_grad``, no dense gradient at all), by handing megatron's ``layers`` module a
  ``torch.nn.functional`` whose ``embedding`` takes that path for weights :func:`enable` marked.

:class:`LazyZero` then spares the per-step zeroing of the whole buffer: the first gradient of a step overwrites.

Numerics: megatron adds the first micro-batch's gradient into zeros, and ``0 + A @ B`` equals ``A @ B`` (MKL's
beta=1 kernel accumulates the same K blocks; an exact zero may change sign, which no update sees), so one
micro-batch per step gives the unfused values; later micro-batches' ``addmm_`` may round differently from a
separate GEMM and add. The embedding adds each token's row into the buffer one by one, where the unfused path
first sums a token's repeats in the gradient's dtype, so a repeated token's row can differ in the last bit (and,
for bf16, is now summed in fp32). ``tests/parallel/test_grad_fusion.py`` compares fused and unfused gradients at
TP1/TP2/PP2, bf16 and ELECTRA.

On a GPU the default stays off (NeMo's default; not run on a GPU here yet); ``true`` there turns on megatron's
apex path for its linears (refused without apex), and the embedding keeps its dense backward, which the CUDA
caching allocator serves without page faults.
"""

from __future__ import annotations

import types
from functools import partial

import torch
import torch.nn.functional as F

from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_FUSED_ATTR = "_bio_megatron_grad_into_main_grad"
_STALE_ATTR = "_bio_megatron_stale"  # on a main_grad: it still holds the last step's values (LazyZero)


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad += grad_output^T @ total_input`` (2-D [tokens, in] and [tokens, out]), apex's contract; a
    buffer :class:`LazyZero` left stale is overwritten instead (it holds the previous step's gradient)."""
    stale = _take_stale(main_grad)
    if total_input.dtype == main_grad.dtype:
        if stale:
            torch.mm(grad_output.t(), total_input, out=main_grad)
        else:
            main_grad.addmm_(grad_output.t(), total_input)
        return
    # Half-precision activations: the GEMM in their dtype, as the unfused gradient, then into the fp32 buffer.
    grad = grad_output.t().mm(total_input)
    if stale:
        main_grad.copy_(grad)  # converts in the copy kernel: no fp32 temporary
    else:
        _add_converted(main_grad, grad)


wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32  # main_grad in half precision: the same cases

CPU_KERNELS = types.SimpleNamespace(wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
                                     wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16)
_CHUNK = 1 << 20  # elements per step of a converting add: its fp32 temporary stays 4 MB


def _add_converted(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst += src`` across dtypes. ``add_`` converts ``src`` into a temporary as large as ``dst`` first, a
    fresh mmap-ed block (and page faults) for every large weight: done in row blocks, the temporary is small and
    reused."""
    rows = max(1, _CHUNK // max(1, dst[0].numel())) if dst.dim() > 1 else _CHUNK
    for start in range(0, dst.shape[0], rows):
        dst[start:start + rows].add_(src[start:start + rows])


def _take_stale(main_grad: torch.Tensor) -> bool:
    if getattr(main_grad, _STALE_ATTR, False):
        setattr(main_grad, _STALE_ATTR, False)
        return True
    return False


class _EmbeddingIntoMainGrad(torch.autograd.Function):
    """``F.embedding`` whose backward adds the looked-up rows' gradients into ``weight.main_grad``."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight = weight  # not saved for backward: only its main_grad is written, never its values read
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        main_grad = weight.main_grad
        if _take_stale(main_grad):
            main_grad.zero_()
        main_grad.index_add_(0, ids.reshape(-1), grad.to(main_grad.dtype))
        weight.grad_added_to_main_grad = True
        # No weight gradient for autograd: DDP's hook then only adds what other users of the weight hand it.
        return None, None


def _embedding(input, weight, *args, **kwargs):
    if (getattr(weight, _FUSED_ATTR, False) and not args and not kwargs and torch.is_grad_enabled()
            and weight.requires_grad):
        return _EmbeddingIntoMainGrad.apply(input, weight)
    return F.embedding(input, weight, *args, **kwargs)


class FusedFunctional(types.ModuleType):
    """``torch.nn.functional`` for megatron's ``tensor_parallel.layers`` module, with the fused embedding."""

    embedding = staticmethod(_embedding)

    def __getattr__(self, name: str):
        return getattr(F, name)


class LazyZero:
    """Zero megatron DDP's gradient buffer only where the hook adds into it; let the fused kernels overwrite the rest.

    megatron's ``zero_grad_buffer`` zeroes the whole buffer every step (1.3 GB at 345m, ~0.2 s on one CPU core),
    then the fused kernels add into the zeros. Here the buffer's ``reset`` zeroes only the parameters whose
    gradient still arrives through DDP's hook (LayerNorms, biases, position embeddings: <1 % of 345m) and marks
    the fused weights' ``main_grad`` stale; a fused kernel overwrites a stale buffer (``mm(out=)``, a converting
    ``copy_``) instead of adding to it, and the embedding zeroes its own. Before anything reads the buffer
    (``start_grad_sync``/``finish_grad_sync``, which ``finalize_model_grads`` calls before the embedding all-reduce
    and the optimizer), weights that got no gradient this step are zeroed. Values equal those of zero-then-add
    except the sign of an exact zero (``0.0 + -0.0`` is +0.0, an overwrite keeps -0.0), which no update sees.
    """

    def __init__(self, ddp, fused: set) -> None:
        self.lazy: list = []
        for buffer in ddp.buffers + ddp.expert_parallel_buffers:
            mine, spans = [], []
            for param, (start, end, _) in buffer.param_index_map.items():
                grad = getattr(param, "main_grad", None)
                if param in fused and grad is not None and grad.data_ptr() == buffer.grad_data[start:].data_ptr():
                    mine.append(param)
                    spans.append((start, end))
            eager, at = [], 0
            for start, end in sorted(spans):
                if start > at:
                    eager.append((at, start))
                at = max(at, end)
            if at < buffer.grad_data.numel():
                eager.append((at, buffer.grad_data.numel()))
            buffer.reset = partial(LazyZero.reset, buffer, eager, mine)
            self.lazy += mine
        for name in ("start_grad_sync", "finish_grad_sync"):
            setattr(ddp, name, self._settled(getattr(ddp, name)))

    @staticmethod
    def reset(buffer, eager: list[tuple[int, int]], lazy: list) -> None:
        for start, end in eager:
            buffer.grad_data[start:end].zero_()
        for grad in buffer.extra_main_grads:
            grad.zero_()
        for param in lazy:
            setattr(param.main_grad, _STALE_ATTR, True)

    def settle(self) -> None:
        """Zero the buffers no kernel wrote since the last reset."""
        for param in self.lazy:
            if _take_stale(param.main_grad):
                param.main_grad.zero_()

    def _settled(self, sync) -> "Settled":
        return Settled(self, sync)


class Settled:
    """DDP's ``start_grad_sync``/``finish_grad_sync`` after :meth:`LazyZero.settle` (a class, so that the seam can
    tell the method in place is ours)."""

    def __init__(self, lazy: LazyZero, sync) -> None:
        self.lazy, self.sync = lazy, sync

    def __call__(self, *args, **kwargs):
        self.lazy.settle()
        return self.sync(*args, **kwargs)


def available() -> bool:
    """Whether megatron-core's linears can fuse here: our kernel on the CPU, apex's on a GPU."""
    from megatron.core.tensor_parallel import layers

    return not torch.cuda.is_available() or layers._grad_accum_fusion_available


def install_cpu() -> None:
    from megatron.core.tensor_parallel import layers

    if not isinstance(layers.F, FusedFunctional):
        layers.F = FusedFunctional("torch.nn.functional")
    if not layers._grad_accum_fusion_available:
        layers.fused_weight_gradient_mlp_cuda = CPU_KERNELS
        layers._grad_accum_fusion_available = True


def resolve(setting: bool | None) -> bool:
    """``model.gradient_accumulation_fusion``: null = on on the CPU, off on a GPU (NeMo's default there; no GPU has
    run the fused path in this project yet), true = on (an error on a GPU without apex), false = off."""
    if setting is None:
        return not torch.cuda.is_available()
    if setting and not available():
        raise ConfigError("model.gradient_accumulation_fusion=true needs apex's fused_weight_gradient_mlp_cuda "
                          "on a GPU (not importable here); set it to null or false")
    return bool(setting)


def enable(ddp, setting: bool | None = None) -> bool:
    """Turn gradient-accumulation fusion on for the linears of ``ddp`` (a megatron-core
    ``DistributedDataParallel``) and, on the CPU, for its vocab-parallel embeddings, with :class:`LazyZero`
    zeroing, when ``setting`` resolves to on. Call right after wrapping the model (DDP creates ``main_grad``),
    before the first forward. Returns whether fusion is on."""
    from megatron.core.tensor_parallel import layers

    if not resolve(setting):
        return False
    on_cpu = not torch.cuda.is_available()
    if on_cpu:
        install_cpu()
    fused: set = set()
    for module in ddp.modules():
        if isinstance(module, (layers.ColumnParallelLinear, layers.RowParallelLinear)):
            module.gradient_accumulation_fusion = True
            if module.weight is not None and module.weight.requires_grad:
                fused.add(module.weight)
        elif isinstance(module, layers.VocabParallelEmbedding):
            w = module.weight
            fuse = (on_cpu and w.requires_grad and hasattr(w, "main_grad") and not module.deterministic_mode
                    and getattr(module, "gtp_remat_size", 1) <= 1 and not module.reduce_scatter_embeddings)
            setattr(w, _FUSED_ATTR, fuse)
            # A fused linear hands autograd an uninitialised placeholder for a weight it shares with the
            # embedding (BERT's and ELECTRA's tied LM head); megatron's zero_out_wgrad makes it zeros, so that
            # the embedding's dense gradient accumulated onto it reaches main_grad intact. A fused embedding
            # writes into main_grad itself and hands autograd nothing: the placeholder is never read and need
            # not be 128 MB of zeros. An unfused one needs the zeros (megatron sets them for BERT at PP1 only).
            w.zero_out_wgrad = not fuse
            if fuse:
                fused.add(w)
    # Only our kernels overwrite a stale buffer (apex's always add); with overlapped reduction megatron's hooks
    # could start a bucket's all-reduce before settle() runs.
    lazy = on_cpu and not ddp.ddp_config.overlap_grad_reduce
    if lazy:
        LazyZero(ddp, fused)
    log.debug("gradient-accumulation fusion: %d weights%s", len(fused), ", lazy zeroing" if lazy else "")
    return True
