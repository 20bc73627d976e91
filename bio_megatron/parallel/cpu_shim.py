"""CPU shim for megatron-core 0.19.2 + torch 2.15 (CUDA build, no driver) on gloo.

Adapted from the project's measured reference (shared/reference/megatron-cpu/mcore_cpu_shim.py).

Call ``install()`` in every process BEFORE building models / optimizers / schedules
(it is idempotent). It does three things:

1. A global TorchFunctionMode (``_CudaToCpuMode``) that rewrites every tensor-factory
   ``device=`` argument that points at CUDA (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")``
   or a bare int as returned by ``torch.cuda.current_device()``) to CPU, turns
   ``Tensor.cuda()`` into a no-op and ``Tensor.to("cuda")`` into ``to("cpu")``, and drops
   ``pin_memory=True``. This covers the ~45 hard-coded ``device='cuda'`` /
   ``.cuda()`` / ``device=torch.cuda.current_device()`` sites in megatron-core
   (schedules.py:749/1121/2292, p2p_communication.py:211-223/334/342,
   language_module.py:307, utils.py:715, param_and_grad_buffer.py:1162-1186,
   optimizer.py:315/690/698/702, clip_grads.py:96-231, dist_checkpointing/exchange_utils.py ...).
2. ``torch.cuda`` stand-ins: current_device -> 0, synchronize -> no-op,
   current_stream/default_stream/Stream/Event/stream -> dummies.
3. Replaces megatron's ``CudaRNGStatesTracker`` with a CPU implementation (same API;
   ``fork()`` swaps the *CPU* default generator state), and points
   ``_get_cuda_rng_state``/``_set_cuda_rng_state`` (used by activation recompute) at the CPU RNG.
   Call model_parallel_cuda_manual_seed(seed) after initialize_model_parallel, as on GPU.
4. ``Tensor.type()`` called from megatron optimizer code returns 'torch.cuda.FloatTensor' for CPU
   fp32 tensors (asserts/branches at clip_grads.py:174, distrib_optimizer.py:401/466/758,
   optimizer.py:1028).
5. Three DistributedOptimizer checkpoint fixes for the torch-AdamW fallback (no apex/TE), see
   _patch_torch_adam_distopt_checkpointing().
Caveats: the TorchFunctionMode is thread-local (torch keeps the mode stack per thread): code that
creates CUDA tensors in a worker thread is NOT covered. On a machine with a GPU install() is a no-op.
Set MCORE_SHIM_LOG=/path/prefix to log every call site the shim rewrote.
"""
import contextlib
import sys

import torch
from torch.overrides import TorchFunctionMode

_INSTALLED = False
_MODE = None
import os as _os
_LOG = _os.environ.get("MCORE_SHIM_LOG")  # path prefix: record every site the shim rewrote
_SITES = set()


def _note(what, depth=2):
    if not _LOG:
        return
    f = sys._getframe(depth)
    fn = f.f_code.co_filename
    if "site-packages/" in fn:
        fn = fn.split("site-packages/")[-1]
    key = f"{fn}:{f.f_lineno} {what}"
    if key not in _SITES:
        _SITES.add(key)
        with open(f"{_LOG}.{_os.getpid()}", "a") as fh:
            fh.write(key + "\n")


def _is_cuda_dev(d):
    if d is None:
        return False
    if isinstance(d, bool):
        return False
    if isinstance(d, int):  # torch.cuda.current_device() style
        return True
    if isinstance(d, str):
        return d.startswith("cuda")
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return False


class _CudaToCpuMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            _note("Tensor.cuda()")
            return args[0]
        if func is torch.Tensor.pin_memory:
            _note("Tensor.pin_memory()")
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # optimizer code asserts param.type() == 'torch.cuda.FloatTensor'
            # (clip_grads.py:174, distrib_optimizer.py:466, optimizer.py:1028)
            r = func(*args)
            caller = sys._getframe(1).f_code.co_filename
            if "megatron" in caller and "optimizer" in caller and r.startswith("torch.") \
                    and not r.startswith("torch.cuda."):
                r = "torch.cuda." + r[len("torch."):]
                _note("Tensor.type() spoofed")
            return r
        if "device" in kwargs and _is_cuda_dev(kwargs["device"]):
            _note(f"{getattr(func, '__name__', func)}(device={kwargs['device']!r})")
            kwargs = dict(kwargs)
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            _note(f"{getattr(func, '__name__', func)}(pin_memory=True)")
            kwargs = dict(kwargs)
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_dev(args[1]):
            _note(f"Tensor.to({args[1]!r})")
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


class _DummyStream:
    def __init__(self, *a, **k):
        _note("torch.cuda.Stream()")

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, event=None):
        return event or _DummyEvent()

    def synchronize(self):
        pass

    def query(self):
        return True

    @staticmethod
    def priority_range():
        return (0, 0)


class _DummyEvent:
    def __init__(self, *a, **k):
        _note("torch.cuda.Event()")

    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def _install_rng_tracker():
    import megatron.core.tensor_parallel.random as tpr

    class CpuRNGStatesTracker(tpr.CudaRNGStatesTracker):
        """Same bookkeeping as CudaRNGStatesTracker but states are CPU generator states."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception('seed {} already exists'.format(seed))
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception('rng state {} already exists'.format(name))
            g = torch.Generator()
            g.manual_seed(seed)
            self.states_[name] = g.get_state()

        @contextlib.contextmanager
        def fork(self, name=tpr._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception('rng state {} is not added'.format(name))
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    tpr.CudaRNGStatesTracker = CpuRNGStatesTracker  # picked up by initialize_rng_tracker()
    tpr._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    tpr._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    # if a tracker was already created, replace it
    tpr._CUDA_RNG_STATE_TRACKER = None
    tpr._CUDA_RNG_STATE_TRACKER_INITIALIZED = False


def prime_adam_state(opt) -> None:
    """Allocate torch Adam/AdamW state (incl. ``step``) that only exists after a first step: megatron-core's
    checkpointing needs it before a load or a state_dict() of a fresh optimizer."""
    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return
    for grp in opt.param_groups:
        for p in grp["params"]:
            st = opt.state[p]
            if "step" not in st:
                st["step"] = torch.zeros((), dtype=torch.float32)
                st.setdefault("exp_avg", torch.zeros_like(p))
                st.setdefault("exp_avg_sq", torch.zeros_like(p))


def _patch_torch_adam_distopt_checkpointing():
    """Without apex/TE, megatron falls back to torch.optim.AdamW, whose per-param state holds a tensor
    'step'. Two places in megatron-core 0.19.2 DistributedOptimizer break on that:
      * distrib_optimizer.py:839 ``assert len(steps) == 1`` in state_dict() when the optimizer has not
        stepped yet (fresh optimizer before loading a checkpoint) -> prime empty state with step=0.
      * distrib_optimizer.py:1223 ``tensors[key]`` KeyError 'step' in
        _set_main_param_and_optimizer_states() while loading 'fully_reshardable' param state
        -> hide 'step' during the copy.
      * 'dp_reshardable' load restores per-param 'step' from the pre-load state (0.0) -> take the
        step from the loaded param_groups.
      * distrib_optimizer.py:1030 ``s["step"] = step`` puts ONE tensor object into every param's
        state; torch.optim.Optimizer.load_state_dict does not copy 'step', and AdamW increments
        step in place (foreach) -> after loading, step advances N_params times per iteration and the
        bias correction is wrong (silent divergence). -> clone 'step' per param after loading.
    """
    from megatron.core.optimizer import distrib_optimizer as dopt

    if getattr(dopt, "HAVE_APEX_OR_TE", True):
        return
    D = dopt.DistributedOptimizer
    _orig_state_dict = D.state_dict
    _orig_set = D._set_main_param_and_optimizer_states

    def state_dict(self):
        prime_adam_state(self.optimizer)
        return _orig_state_dict(self)

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        gi, go = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[gi]["params"][go]
        st = self.optimizer.state[main_param]
        step = st.pop("step", None) if "step" not in tensors else None
        try:
            # no_grad: load_parameter_state_from_dp_reshardable (distrib_optimizer.py:2093) is not
            # decorated with @torch.no_grad() and fp32 main params are views of leaf params.
            with torch.no_grad():
                return _orig_set(self, model_param, tensors)
        finally:
            if step is not None:
                st["step"] = step

    _orig_load = D.load_state_dict

    def load_state_dict(self, state_dict):
        r = _orig_load(self, state_dict)
        # authoritative step = the one stored in param_groups (state_dict() writes it there);
        # 'dp_reshardable' otherwise restores the *pre-load* per-param step tensors (observed: 0.0).
        steps = {g.get("step") for g in state_dict.get("optimizer", {}).get("param_groups", [])}
        steps.discard(None)
        step = float(next(iter(steps))) if len(steps) == 1 else None
        for st in self.optimizer.state.values():
            if torch.is_tensor(st.get("step")):
                st["step"] = (torch.tensor(step, dtype=torch.float32) if step is not None
                              else st["step"].detach().clone())
        return r

    D.state_dict = state_dict
    D._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states
    D.load_state_dict = load_state_dict


def install():
    global _INSTALLED, _MODE
    if _INSTALLED:
        return
    if torch.cuda.is_available():
        # Real GPU: no CUDA stand-ins. The torch-Adam distributed-optimizer fixes still apply when
        # megatron-core runs without apex/TE (a plain pip install); the patch checks that itself.
        _patch_torch_adam_distopt_checkpointing()
        _INSTALLED = True
        return
    c = torch.cuda

    def _logged(name, fn):
        def w(*a, **k):
            _note(f"torch.cuda.{name}()")
            return fn(*a, **k)
        return w

    c.current_device = _logged("current_device", lambda: 0)
    c.synchronize = _logged("synchronize", lambda *a, **k: None)
    c.current_stream = _logged("current_stream", lambda *a, **k: _DummyStream())
    c.default_stream = _logged("default_stream", lambda *a, **k: _DummyStream())
    c.Stream = _DummyStream
    c.Event = _DummyEvent
    c.stream = _logged("stream", lambda *a, **k: contextlib.nullcontext())
    c.set_device = _logged("set_device", lambda *a, **k: None)
    c.get_rng_state = _logged("get_rng_state", lambda *a, **k: torch.get_rng_state())
    c.set_rng_state = _logged("set_rng_state", lambda s, *a, **k: torch.set_rng_state(s))
    c.manual_seed = _logged("manual_seed", lambda seed: None)  # CPU seeding via torch.manual_seed
    c.empty_cache = _logged("empty_cache", lambda: None)
    _install_rng_tracker()
    _patch_torch_adam_distopt_checkpointing()
    _MODE = _CudaToCpuMode()
    _MODE.__enter__()  # global, same trick torch.set_default_device uses
    _INSTALLED = True
