"""Redirect megatron-core's CUDA tensor creation to the CPU, in megatron-core's code only.

megatron-core 0.19.2 creates tensors on the GPU in about 45 places that a CPU training run reaches (buffers with
``device=torch.cuda.current_device()`` or ``device="cuda"``, ``.cuda()`` on tied embeddings, pinned host
buffers, ``param.type() == 'torch.cuda.FloatTensor'`` asserts); see ``shared/reference/megatron-cpu/shim_sites.txt``
and the list in :mod:`bio_megatron.parallel.cpu_shim`. An AST scan of its sources shows every ``device=`` and
``pin_memory=`` argument sits in a call of one of the factories in ``FACTORIES`` on the module-level name ``torch``.

So, instead of a global ``TorchFunctionMode`` that sees every torch call of the process (the model's forward, the
optimizer's per-parameter arithmetic, and the Hugging Face baseline in ``bench pretrain`` alike):

* every ``megatron.core`` module's global ``torch`` becomes :class:`MegatronTorch`, a view of the real module
  whose factories map a CUDA device (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")``, or an int, which is what
  ``torch.cuda.current_device()`` returns) to ``"cpu"`` and drop ``pin_memory=True``. Modules imported later get it
  from an import hook, so lazy imports (dist_checkpointing strategies, schedules) are covered too;
* ``Tensor.cuda()`` and ``Tensor.pin_memory()`` return the tensor, and ``Tensor.to()`` maps a CUDA device to the CPU
  (all three can only fail on a machine without CUDA); ``Tensor.type()`` with no argument, called from megatron's
  optimizer code, answers ``torch.cuda.FloatTensor`` for a CPU float tensor.

Everything else (the other torch functions, and any code outside megatron-core) runs untouched. Unlike a mode,
which is thread-local, this also covers megatron code running in worker threads.
``MCORE_SHIM_GLOBAL_MODE=1`` restores the former global mode (:class:`CudaToCpuMode`) for diagnosing a site this
misses; ``MCORE_SHIM_LOG=/path/prefix`` logs each rewritten call site, one file per process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

_SITES: set[str] = set()
PACKAGE = "megatron.core"

# The factories megatron-core 0.19.2 calls with device= or pin_memory= (AST scan: empty 208, zeros 141, tensor 133,
# arange 115, full 41, ones 21, empty_like 9, rand 5, as_tensor 3, ...), plus their siblings. torch.Generator
# (inference only) is left alone: megatron also isinstance-checks it.
FACTORIES = ("empty", "zeros", "tensor", "arange", "full", "ones", "empty_like", "rand", "as_tensor", "randn",
             "linspace", "zeros_like", "randint", "ones_like", "eye", "full_like", "rand_like", "randn_like",
             "randint_like", "empty_strided", "randperm", "scalar_tensor", "logspace")


def note(what: str, depth: int = 2) -> None:
    """Record the call site ``depth`` frames up (with ``MCORE_SHIM_LOG`` set; read per call, as this only runs when a
    site is rewritten, so that a forked test world can switch it on)."""
    prefix = os.environ.get("MCORE_SHIM_LOG")
    if not prefix:
        return
    f = sys._getframe(depth)
    fn = f.f_code.co_filename
    if "site-packages/" in fn:
        fn = fn.split("site-packages/")[-1]
    key = f"{fn}:{f.f_lineno} {what}"
    if key not in _SITES:
        _SITES.add(key)
        with open(f"{prefix}.{os.getpid()}", "a") as fh:
            fh.write(key + "\n")


def is_cuda_device(d: Any) -> bool:
    if d is None or isinstance(d, bool):
        return False
    if isinstance(d, int):  # torch.cuda.current_device() style
        return True
    if isinstance(d, str):
        return d.startswith("cuda")
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return False


def _to_cpu_kwargs(name: str, kwargs: dict) -> dict:
    """``kwargs`` (a fresh dict, changed in place) with a CUDA ``device`` mapped to the CPU and ``pin_memory``
    dropped; each rewrite is logged at the call site two frames up (the caller of a factory wrapper, or of the
    torch function a mode intercepts)."""
    if is_cuda_device(kwargs.get("device")):
        note(f"{name}(device={kwargs['device']!r})", depth=3)
        kwargs["device"] = "cpu"
    if kwargs.get("pin_memory"):
        note(f"{name}(pin_memory=True)", depth=3)
        kwargs["pin_memory"] = False
    return kwargs


def _cpu_factory(name: str) -> Callable:
    def factory(*args, **kwargs):
        # looked up per call: a later patch of torch.<name> applies
        return getattr(torch, name)(*args, **_to_cpu_kwargs(name, kwargs))

    factory.__name__ = factory.__qualname__ = name
    return factory


class MegatronTorch(types.ModuleType):
    """``torch`` as megatron-core's modules see it: the factories in ``FACTORIES`` are CPU-redirecting wrappers,
    every other attribute is looked up on the real module at each access (so a test's monkeypatch of ``torch.save``
    still reaches megatron)."""

    def __init__(self) -> None:
        super().__init__("torch", torch.__doc__)
        for name in FACTORIES:
            if hasattr(torch, name):
                setattr(self, name, _cpu_factory(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


MEGATRON_TORCH = MegatronTorch()


def retarget(module: types.ModuleType) -> bool:
    """Point ``module``'s global ``torch`` at :class:`MegatronTorch`; False if it has none."""
    if module.__dict__.get("torch") is torch:
        module.torch = MEGATRON_TORCH
        return True
    return False


class _RetargetingLoader(importlib.abc.Loader):
    """Runs the real loader, then retargets the module (its functions read ``torch`` from the module's globals at
    call time, so retargeting after the module body ran covers every function in it)."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        retarget(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ... for inspect and importlib
        return getattr(self._inner, name)


class _MegatronFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path, target=None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RetargetingLoader(spec.loader)
        return spec


# torch's own Tensor.to and Tensor.type, which the stand-ins below call (taken before anything replaces them).
_TENSOR_TO, _TENSOR_TYPE = torch.Tensor.to, torch.Tensor.type


def tensor_cuda(self, *args, **kwargs):
    """``Tensor.cuda()``: the tensor itself (there is no GPU)."""
    note("Tensor.cuda()")
    return self


def tensor_pin_memory(self, *args, **kwargs):
    """``Tensor.pin_memory()``: the tensor itself (pinning needs CUDA)."""
    note("Tensor.pin_memory()")
    return self


def tensor_to(self, *args, **kwargs):
    """``Tensor.to()`` with a CUDA device mapped to the CPU."""
    if args and is_cuda_device(args[0]):
        note(f"Tensor.to({args[0]!r})")
        args = ("cpu", *args[1:])
    if is_cuda_device(kwargs.get("device")):
        note(f"Tensor.to(device={kwargs['device']!r})")
        kwargs["device"] = "cpu"
    return _TENSOR_TO(self, *args, **kwargs)


def tensor_type(self, *args, **kwargs):
    """``Tensor.type()``: ``torch.cuda.<T>`` for a CPU tensor when megatron's optimizer code asks."""
    r = _TENSOR_TYPE(self, *args, **kwargs)
    if args or kwargs or not r.startswith("torch.") or r.startswith("torch.cuda."):
        return r
    # optimizer code asserts param.type() == 'torch.cuda.FloatTensor' (clip_grads.py:174,
    # distrib_optimizer.py:401/466/758, optimizer.py:1028)
    caller = sys._getframe(1).f_code.co_filename
    if "megatron" in caller and "optimizer" in caller:
        note("Tensor.type() spoofed")
        return "torch.cuda." + r[len("torch."):]
    return r


def _patch_tensor_methods() -> None:
    T = torch.Tensor
    T.cuda, T.pin_memory, T.to, T.type = tensor_cuda, tensor_pin_memory, tensor_to, tensor_type


class CudaToCpuMode(TorchFunctionMode):
    """The former mechanism, kept for diagnosis (``MCORE_SHIM_GLOBAL_MODE=1``): the factory rewrites for every
    torch call of the process, at a Python dispatch per call (the Tensor methods are patched either way)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **_to_cpu_kwargs(getattr(func, "__name__", str(func)), dict(kwargs or {})))


def install() -> str:
    """Install the redirection (once per process, without CUDA: :func:`bio_megatron.parallel.seam.install` calls
    it); returns which mechanism is active."""
    _patch_tensor_methods()  # also under the global mode: Tensor.type() is spoofed here, not in the mode
    if os.environ.get("MCORE_SHIM_GLOBAL_MODE") == "1":
        CudaToCpuMode().__enter__()  # global and never exited, as torch.set_default_device does it
        return "global TorchFunctionMode"
    for name, module in list(sys.modules.items()):
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and isinstance(module, types.ModuleType):
            retarget(module)
    if not any(isinstance(f, _MegatronFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MegatronFinder())
    return f"megatron-core modules' torch ({len(FACTORIES)} factories), Tensor.cuda/pin_memory/to/type"
