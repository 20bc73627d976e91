"""The megatron-core seam: every replacement we make in megatron-core or torch, in one table, installed from it.

megatron-core 0.19.2 on a CPU (gloo, the CUDA build of torch without a driver) and without apex or Transformer
Engine needs a few of its attributes replaced: CUDA calls, its RNG tracker, fallbacks that are slow or wrong for
torch's Adam, a process its checkpoint saves start, the ``pickle`` its loads trust. Each is a row of
:data:`REPLACEMENTS`: the target (a dotted path; ``Class().attr`` is set on each instance, ``megatron.core.*.torch``
on every module of the package), why, when it applies, the test that guards it, and the installer (the function
in this package that makes it). :func:`install` is the only way they are made:

* ``with install("import")`` while :func:`import_megatron_core` imports megatron-core (start-up of finetune/predict);
* ``install("process")`` once per process before anything is built (``init_distributed``), after checking that
  the installed megatron-core is the one pinned in ``pyproject.toml`` (:data:`MCORE_PIN`);
* ``install("model", ddp=..., setting=...)`` for each megatron DDP model (gradient-accumulation fusion);
* ``with install("build", norm_for=...)`` while a sequence-parallel model is built;
* ``install("save")`` before each dist-checkpointing save, ``with install("load", unpickler=...)`` around a load.

:func:`check` says which applicable rows are not in place; ``tests/engine/test_seam.py`` checks every row that way
and scans the package for replacements missing from the table. docs/ARCHITECTURE.md renders :func:`markdown`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import queue
import sys
from typing import Any, Callable, Literal

import torch

from bio_megatron.parallel import cpu_shim, device_redirect, dist_ckpt, grad_fusion, lean_import, multi_tensor, norm_swap
from bio_megatron.utils.errors import BioMegatronError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

MCORE_PIN = "0.19.2"  # pyproject.toml pins megatron-core==this (tests/engine/test_seam.py compares the two)
ALLOW_ENV = "BIO_MEGATRON_ALLOW_MCORE"  # =<installed version>: run on it anyway (trying an upgrade), with a warning

Scope = Literal["import", "process", "model", "build", "save", "load"]
SCOPED = ("import", "build", "load")  # their installers are context managers: undone when the ``with`` block ends


class VersionError(BioMegatronError):
    """The installed megatron-core is not the version the seam was written against."""


def _always(ctx: dict) -> bool:
    return True


def _no_cuda(ctx: dict) -> bool:
    return not torch.cuda.is_available()


def _module_torch(ctx: dict) -> bool:
    return _no_cuda(ctx) and os.environ.get("MCORE_SHIM_GLOBAL_MODE") != "1"  # the diagnosis mode replaces nothing


def _torch_adam(ctx: dict) -> bool:
    from megatron.core.optimizer import distrib_optimizer

    return not getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True)


def _local_kernel(module: str, attr: str, local: str) -> Callable[[dict], bool]:
    def applies(ctx: dict) -> bool:
        from megatron.core import utils

        found = getattr(importlib.import_module(module), attr, None)
        return found is getattr(utils, local) or getattr(found, "__module__", "") == multi_tensor.__name__
    return applies


def _fusion(ctx: dict) -> bool:
    return grad_fusion.resolve(ctx["setting"])


def _cpu_fusion(ctx: dict) -> bool:
    return _fusion(ctx) and _no_cuda(ctx)


def _lazy_zero(ctx: dict) -> bool:
    return _cpu_fusion(ctx) and not ctx["ddp"].ddp_config.overlap_grad_reduce


def _torch_norm_block(ctx: dict) -> bool:
    from megatron.core.transformer import transformer_block as tb

    return not (tb.HAVE_TE or tb.HAVE_APEX)


def _torch_norm_head(ctx: dict) -> bool:
    from megatron.core.models.bert import bert_lm_head

    return not bert_lm_head.HAVE_FUSED_LAYER_NORM


def _is(get: Callable[[], Any]) -> Callable[[Any], bool]:
    return lambda value: value is get()


def _instance_of(get: Callable[[], type]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, get())


def _our_class(value: Any) -> bool:
    return getattr(value, "__module__", "").startswith("bio_megatron.")


@dataclasses.dataclass(frozen=True)
class Replacement:
    target: str  # dotted path; "pkg.Class().attr": on each instance; "megatron.core.*.torch": every module's
    why: str
    when: str  # in words; ``applies`` decides
    guard: str  # the test that fails when this replacement stops doing its job
    scope: Scope
    installer: Callable[..., Any]  # called once per install() of its scope, in table order, if any row applies
    ours: Callable[[Any], bool]  # whether the value found at ``target`` is the replacement
    applies: Callable[[dict], bool] = _always
    args: tuple[str, ...] = ()  # the install() keywords the installer takes, in order
    also_sets: tuple[str, ...] = ()  # flags and state the installer resets with it (not replacements themselves)


_SHIM = "tests/parallel/test_cpu_shim.py::test_tp2pp2_step_rewrites_megatron_sites_only"
_CPU = "no CUDA (a CPU run)"


def _cuda(name: str, why: str) -> Replacement:
    return Replacement(f"torch.cuda.{name}", why, _CPU, _SHIM, "process", cpu_shim.install_cuda_standins,
                       _is(lambda: cpu_shim.CUDA_STANDINS[name]), _no_cuda)


def _tensor(name: str, why: str, ours: Callable[[], Any]) -> Replacement:
    return Replacement(f"torch.Tensor.{name}", why, _CPU, _SHIM, "process", device_redirect.install, _is(ours),
                       _no_cuda)


_RNG = "tests/parallel/test_recompute.py::test_recompute_gradients_equal_with_dropout_at_tp2"
_DISTOPT = "tests/engine/test_resume.py::test_distributed_optimizer_checkpoint_resumes_exactly"
_DISTOPT_WHEN = "megatron-core without apex or Transformer Engine (torch's AdamW), also on a GPU"
_KERNELS = "tests/parallel/test_multi_tensor.py::test_stand_ins_are_bit_identical_and_installed"
_FUSION = "tests/parallel/test_grad_fusion.py::test_fused_gradients_equal_megatrons_unfused"
_SP = "tests/parallel/test_sequence_parallel.py::test_tp2_sequence_parallel_matches_tp1"
_TPR = "megatron.core.tensor_parallel.random"
_DOPT = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"
_LAYERS = "megatron.core.tensor_parallel.layers"

REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement("torch.compile", "megatron-core decorates ~40 fused helpers with torch.compile as its modules load, "
                "which imports TorchDynamo and Inductor (~2.6 s of start-up on two cores): the real call is made on a "
                "helper's first call instead; `import wandb` (megatron.core.timers, for Timers.write, unused here) "
                "fails meanwhile", "while finetune and predict import megatron-core (import_megatron_core)",
                "tests/bench/test_startup.py::test_megatron_core_imports_without_inductor_and_wandb_and_leaves_both_"
                "usable", "import", lean_import.deferring, _is(lambda: lean_import.deferred_compile)),
    _cuda("current_device", "megatron puts buffers on `device=torch.cuda.current_device()`: 0, which the "
          "redirect maps to the CPU"),
    _cuda("synchronize", "a no-op: CPU work is synchronous"),
    _cuda("current_stream", "a stream that does nothing (megatron waits on streams in DDP and p2p)"),
    _cuda("default_stream", "as current_stream"),
    _cuda("Stream", "the class megatron instantiates for side streams: the stand-in"),
    _cuda("Event", "an event that does nothing (timers, overlap hooks)"),
    _cuda("stream", "a context manager that does nothing"),
    _cuda("set_device", "a no-op: there is one device, the CPU"),
    _cuda("get_rng_state", "the CPU generator's state (activation recompute saves it)"),
    _cuda("set_rng_state", "restores the CPU generator's state"),
    _cuda("manual_seed", "a no-op: the CPU generator is seeded by torch.manual_seed"),
    _cuda("empty_cache", "a no-op: no CUDA caching allocator"),
    Replacement(f"{_TPR}.CudaRNGStatesTracker", "per-TP-rank dropout streams as CPU generator states (fork swaps "
                "the CPU generator)", _CPU, _RNG, "process", cpu_shim.install_rng_tracker,
                _is(lambda: cpu_shim.cpu_rng_tracker_class()), _no_cuda,
                also_sets=(f"{_TPR}._CUDA_RNG_STATE_TRACKER", f"{_TPR}._CUDA_RNG_STATE_TRACKER_INITIALIZED")),
    Replacement(f"{_TPR}._get_cuda_rng_state", "activation recompute saves the CPU generator's state", _CPU, _RNG,
                "process", cpu_shim.install_rng_tracker, _is(lambda: cpu_shim.get_cpu_rng_state), _no_cuda),
    Replacement(f"{_TPR}._set_cuda_rng_state", "and restores it", _CPU, _RNG, "process",
                cpu_shim.install_rng_tracker, _is(lambda: cpu_shim.set_cpu_rng_state), _no_cuda),
    Replacement(f"{_DOPT}.state_dict", "a fresh torch Adam has no `step` yet (assert at distrib_optimizer.py:839): "
                "primed first", _DISTOPT_WHEN, _DISTOPT, "process", cpu_shim.patch_torch_adam_distopt_checkpointing,
                _is(lambda: cpu_shim.distopt_state_dict), _torch_adam),
    Replacement(f"{_DOPT}._set_main_param_and_optimizer_states", "KeyError 'step' loading fully_reshardable "
                "state: `step` hidden during the copy", _DISTOPT_WHEN, _DISTOPT, "process",
                cpu_shim.patch_torch_adam_distopt_checkpointing,
                _is(lambda: cpu_shim.distopt_set_main_param_and_optimizer_states), _torch_adam),
    Replacement(f"{_DOPT}.load_state_dict", "one shared `step` tensor advanced once per parameter (wrong bias "
                "correction after a resume): a step per parameter, from param_groups", _DISTOPT_WHEN, _DISTOPT,
                "process", cpu_shim.patch_torch_adam_distopt_checkpointing,
                _is(lambda: cpu_shim.distopt_load_state_dict), _torch_adam),
    Replacement("megatron.core.optimizer.clip_grads.multi_tensor_scale_impl", "in place instead of a temporary per "
                "tensor (clipping), bit-identical", "megatron uses its pure-PyTorch fallback (no apex/TE)", _KERNELS,
                "process", multi_tensor.install, _is(lambda: multi_tensor.multi_tensor_scale),
                _local_kernel("megatron.core.optimizer.clip_grads", "multi_tensor_scale_impl",
                              "local_multi_tensor_scale")),
    Replacement("megatron.core.optimizer.optimizer.multi_tensor_scale_impl", "the fp16 optimizer's main-to-model "
                "copy as one foreach copy, bit-identical", "megatron uses its pure-PyTorch fallback (no apex/TE)",
                _KERNELS, "process", multi_tensor.install, _is(lambda: multi_tensor.multi_tensor_scale),
                _local_kernel("megatron.core.optimizer.optimizer", "multi_tensor_scale_impl",
                              "local_multi_tensor_scale")),
    Replacement("megatron.core.optimizer.clip_grads.l2_norm_impl", "the gradient norm without one `.item()` per "
                "tensor, bit-identical", "megatron uses its pure-PyTorch fallback (no apex/TE)", _KERNELS,
                "process", multi_tensor.install, _is(lambda: multi_tensor.multi_tensor_l2_norm),
                _local_kernel("megatron.core.optimizer.clip_grads", "l2_norm_impl", "local_multi_tensor_l2_norm")),
    Replacement("megatron.core.*.torch", "megatron-core's modules see a torch whose factories map a CUDA device to "
                "the CPU and drop pin_memory (modules imported later too, by an import hook); code outside "
                "megatron-core sees plain torch", _CPU + ", unless MCORE_SHIM_GLOBAL_MODE=1", _SHIM, "process",
                device_redirect.install, _is(lambda: device_redirect.MEGATRON_TORCH), _module_torch),
    _tensor("cuda", "the tensor itself (tied embeddings across stages call .cuda())",
            lambda: device_redirect.tensor_cuda),
    _tensor("pin_memory", "the tensor itself (host buffers of checkpointing)",
            lambda: device_redirect.tensor_pin_memory),
    _tensor("to", "a CUDA device maps to the CPU", lambda: device_redirect.tensor_to),
    _tensor("type", "`torch.cuda.FloatTensor` for a CPU float tensor when megatron's optimizer asserts it",
            lambda: device_redirect.tensor_type),
    Replacement(f"{_LAYERS}.ColumnParallelLinear().gradient_accumulation_fusion", "megatron's fused weight-gradient "
                "path switched on (apex's kernel on a GPU, ours below on the CPU)",
                "model.gradient_accumulation_fusion resolves on (null: on the CPU only)", _FUSION, "model",
                grad_fusion.enable, lambda value: value is True, _fusion, args=("ddp", "setting")),
    Replacement(f"{_LAYERS}.RowParallelLinear().gradient_accumulation_fusion", "as ColumnParallelLinear",
                "model.gradient_accumulation_fusion resolves on (null: on the CPU only)", _FUSION, "model",
                grad_fusion.enable, lambda value: value is True, _fusion, args=("ddp", "setting")),
    Replacement(f"{_LAYERS}.fused_weight_gradient_mlp_cuda", "apex's wgrad-into-main_grad kernels, for the CPU "
                "(one addmm_)", "gradient-accumulation fusion on, no CUDA", _FUSION, "model", grad_fusion.enable,
                _is(lambda: grad_fusion.CPU_KERNELS), _cpu_fusion, args=("ddp", "setting"),
                also_sets=(f"{_LAYERS}._grad_accum_fusion_available",)),
    Replacement(f"{_LAYERS}.F", "torch.nn.functional whose embedding adds the batch's rows into main_grad (no "
                "dense [vocab, hidden] gradient)", "gradient-accumulation fusion on, no CUDA", _FUSION, "model",
                grad_fusion.enable, _instance_of(lambda: grad_fusion.FusedFunctional), _cpu_fusion,
                args=("ddp", "setting")),
    Replacement("megatron.core.distributed.DistributedDataParallel().start_grad_sync", "zeroes the lazily zeroed "
                "gradient buffers no kernel wrote before the reduction reads them", "gradient-accumulation fusion "
                "on, no CUDA, no overlapped reduction", _FUSION, "model", grad_fusion.enable,
                _instance_of(lambda: grad_fusion.Settled), _lazy_zero, args=("ddp", "setting")),
    Replacement("megatron.core.distributed.DistributedDataParallel().finish_grad_sync", "as start_grad_sync",
                "gradient-accumulation fusion on, no CUDA, no overlapped reduction", _FUSION, "model",
                grad_fusion.enable, _instance_of(lambda: grad_fusion.Settled), _lazy_zero, args=("ddp", "setting")),
    Replacement("megatron.core.distributed.param_and_grad_buffer._ParamAndGradBuffer().reset", "zeroes only what "
                "DDP's hook adds into; the fused kernels overwrite the rest", "gradient-accumulation fusion on, no "
                "CUDA, no overlapped reduction", _FUSION, "model", grad_fusion.enable,
                lambda value: getattr(value, "func", None) is grad_fusion.LazyZero.reset, _lazy_zero,
                args=("ddp", "setting")),
    Replacement("megatron.core.transformer.transformer_block.LayerNormImpl", "the final LayerNorm tagged "
                "sequence-parallel (its gradient is all-reduced over TP, as apex's FusedLayerNorm is)",
                "while a sequence-parallel model is built with megatron's PyTorch norm", _SP, "build",
                norm_swap.fallback_norms, _our_class, _torch_norm_block, args=("norm_for",)),
    Replacement("megatron.core.models.bert.bert_lm_head.LNImpl", "the MLM head's LayerNorm, as above",
                "while a sequence-parallel model is built with megatron's PyTorch norm", _SP, "build",
                norm_swap.fallback_norms, _our_class, _torch_norm_head, args=("norm_for",)),
    Replacement("megatron.core.dist_checkpointing.strategies.filesystem_async._results_queue", "a thread-safe "
                "queue instead of a spawn multiprocessing.Manager (3-4 s per first save; outlives a SIGKILLed rank)",
                "every dist-checkpointing save", "tests/reliability/test_orphans.py::"
                "test_sigkill_during_saves_leaves_no_process", "save", dist_ckpt.in_process_write_queue,
                _instance_of(lambda: queue.Queue)),
    Replacement("torch.distributed.checkpoint.filesystem.pickle", "`.metadata` unpickled through an allow-list "
                "(torch's reader uses plain pickle.load)", "during every dist-checkpointing load",
                "tests/reliability/test_untrusted_files.py::test_crafted_checkpoint_runs_nothing", "load",
                dist_ckpt.metadata_pickle, _instance_of(lambda: dist_ckpt.MetadataPickle), args=("unpickler",)),
)


def installed_version() -> str:
    return importlib.metadata.version("megatron-core")


_WARNED: set[str] = set()


def check_version() -> None:
    """Refuse a megatron-core other than :data:`MCORE_PIN` (one line naming both), unless ``ALLOW_ENV`` names it."""
    found = installed_version()
    if found == MCORE_PIN:
        return
    if os.environ.get(ALLOW_ENV) == found:
        if found not in _WARNED:
            _WARNED.add(found)
            log.warning("megatron-core %s is installed, not the pinned %s; running anyway (%s=%s): the replacements "
                        "in docs/ARCHITECTURE.md 'The megatron-core seam' may not fit it", found, MCORE_PIN,
                        ALLOW_ENV, found)
        return
    raise VersionError(f"megatron-core {found} is installed, but bio-megatron is written against megatron-core "
                       f"{MCORE_PIN} (pip install megatron-core=={MCORE_PIN}); to try {found} anyway, set "
                       f"{ALLOW_ENV}={found}")


class Installed(contextlib.ExitStack):
    """What one :func:`install` made; for the scoped scopes, leaving its ``with`` block undoes it."""

    def __init__(self, rows: tuple[Replacement, ...]) -> None:
        super().__init__()
        self.rows = rows


_PROCESS_DONE: set[Callable] = set()


def install(scope: Scope = "process", **ctx: Any) -> Installed:
    """Make the replacements of ``scope`` whose condition holds (``ctx``: the keywords their installers take)."""
    if scope == "process":
        check_version()
    rows = [r for r in REPLACEMENTS if r.scope == scope]
    applied: list[Replacement] = []
    done = Installed(())
    # Table order, each installer once; a condition is read just before its installer runs (the CUDA stand-ins are
    # in place before the conditions of later rows import megatron-core's optimizer modules).
    for installer in dict.fromkeys(r.installer for r in rows):
        mine = [r for r in rows if r.installer is installer and r.applies(ctx)]
        if not mine:
            continue
        applied += mine
        if scope == "process" and installer in _PROCESS_DONE:
            continue
        result = installer(*(ctx[a] for a in mine[0].args))
        if scope in SCOPED:
            done.enter_context(result)
        elif isinstance(result, str):
            log.debug("%s: %s", installer.__module__, result)
        if scope == "process":
            _PROCESS_DONE.add(installer)
    done.rows = tuple(applied)
    return done


def import_megatron_core() -> None:
    """``import megatron.core`` (the whole package, as its ``__init__`` loads it) inside the "import" scope; nothing
    happens once it is imported (a forked test world, a second call)."""
    if "megatron.core" in sys.modules:
        return
    with install("import"):
        import megatron.core  # noqa: F401


def _import_attr(path: str) -> tuple[Any, str]:
    """The object holding the last name of ``path`` (the longest importable module, then attributes)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1]
    raise ImportError(path)


def values_at(target: str, ddp: Any = None) -> list[Any]:
    """What is now at ``target``: one value, or one per module / per instance (of ``ddp``'s modules and buffers)."""
    if ".*." in target:
        package, attr = target.split(".*.")
        return [m.__dict__[attr] for n, m in sorted(sys.modules.items())
                if (n == package or n.startswith(package + ".")) and getattr(m.__dict__.get(attr), "__name__", "")
                == attr]
    if "()." in target:
        cls_path, attr = target.split("().")
        holder, name = _import_attr(cls_path)
        cls = getattr(holder, name)
        found = [*(ddp.modules() if ddp is not None else ()),
                 *((getattr(ddp, "buffers", []) + getattr(ddp, "expert_parallel_buffers", [])) if ddp is not None
                   else ())]
        return [getattr(x, attr) for x in found if isinstance(x, cls)]
    holder, name = _import_attr(target)
    return [getattr(holder, name)]


def check(scope: Scope, **ctx: Any) -> list[str]:
    """The rows of ``scope`` that apply but are not in place now, each as one line (empty: all in place)."""
    problems = []
    for row in REPLACEMENTS:
        if row.scope != scope or not row.applies(ctx):
            continue
        values = values_at(row.target, ctx.get("ddp"))
        if not values:
            problems.append(f"{row.target}: nothing found there")
        problems += [f"{row.target}: {v!r} is not ours" for v in values if not row.ours(v)]
    return problems


def markdown() -> str:
    """The table as docs/ARCHITECTURE.md renders it."""
    lines = ["| target | why | when | scope | guarded by |", "|---|---|---|---|---|"]
    for r in REPLACEMENTS:
        target = f"`{r.target}`" + "".join(f" (+ `{a.rsplit('.', 1)[1]}`)" for a in r.also_sets)
        lines.append(f"| {target} | {r.why} | {r.when} | {r.scope} | `{r.guard}` |")
    return "\n".join(lines) + "\n"
