"""CPU shim for megatron-core 0.19.2 + torch 2.15 (CUDA build, no driver) on gloo.

Adapted from the project's measured reference (shared/reference/megatron-cpu/mcore_cpu_shim.py).

Installed by :func:`bio_megatron.parallel.seam.install` (``install("process")``, which
:func:`bio_megatron.parallel.distributed.init_distributed` calls in every process BEFORE building models /
optimizers / schedules; idempotent), from the seam's table of replacements. Five things:

1. Redirects megatron-core's CUDA tensor creation to the CPU, in megatron-core's own modules only
   (:mod:`bio_megatron.parallel.device_redirect`): their global ``torch`` is a view of torch whose tensor
   factories map ``device="cuda"``/``"cuda:N"``/``torch.device("cuda")``/an int (what
   ``torch.cuda.current_device()`` returns) to CPU and drop ``pin_memory=True``; ``Tensor.cuda()`` and
   ``Tensor.pin_memory()`` return the tensor and ``Tensor.to("cuda")`` goes to the CPU. The sites a CPU run
   reaches, as logged with MCORE_SHIM_LOG over the engine, checkpoint, fine-tuning and interchange tests
   (2026-11-23, 41 entries with the torch.cuda stand-ins below): schedules.py:749/2292,
   p2p_communication.py:331-342/419, language_module.py:307, utils.py:712,
   param_and_grad_buffer.py:632/1177-1186, optimizer.py:315/690/698/702/1009/1249, grad_scaler.py:20/111-117/163,
   clip_grads.py:108-180, distrib_optimizer.py:401/466/758/1362-1374, state_dict_saver.py:251,
   filesystem_async.py:248, random.py:490. Until 2026-11-23 this was a global ``TorchFunctionMode`` through which
   every torch call of the process went (~2 us each; the model's forward, Adam's per-tensor arithmetic and the
   Hugging Face baseline of ``bench pretrain`` alike); ``MCORE_SHIM_GLOBAL_MODE=1`` brings it back for diagnosis.
2. ``torch.cuda`` stand-ins: current_device -> 0, synchronize -> no-op,
   current_stream/default_stream/Stream/Event/stream -> dummies.
3. Replaces megatron's ``CudaRNGStatesTracker`` with a CPU implementation (same API;
   ``fork()`` swaps the *CPU* default generator state), and points
   ``_get_cuda_rng_state``/``_set_cuda_rng_state`` (used by activation recompute) at the CPU RNG.
   Call model_parallel_cuda_manual_seed(seed) after initialize_model_parallel, as on GPU.
4. ``Tensor.type()`` called from megatron optimizer code returns 'torch.cuda.FloatTensor' for CPU
   fp32 tensors (asserts/branches at clip_grads.py:174, distrib_optimizer.py:401/466/758,
   optimizer.py:1009), patched in :mod:`bio_megatron.parallel.device_redirect`.
5. Without apex/TE (also on a GPU): three DistributedOptimizer checkpoint fixes for the torch-AdamW fallback
   (:func:`patch_torch_adam_distopt_checkpointing`), and bit-identical in-place/foreach stand-ins for megatron's
   pure-Python multi_tensor_scale/l2norm fallbacks (:mod:`bio_megatron.parallel.multi_tensor`).
On a machine with a GPU only (5) applies. Set MCORE_SHIM_LOG=/path/prefix to log every call site the shim
rewrote (``tests/parallel/test_cpu_shim.py`` checks the sites of a TP2xPP2 step that way).

Not replaced: the collectives of megatron's sequence parallelism. torch 2.15's gloo implements
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (fp32, bf16, fp16), which megatron's
``tensor_parallel.mappings`` and linears call; ``tests/parallel/test_sequence_parallel.py`` checks them against
their definitions in a 2-rank gloo world. Activation recompute needs nothing beyond (3): megatron's
``CheckpointFunction`` saves and restores the CPU RNG, the "CUDA" RNG (the CPU one here) and the tracker's states
(``tests/parallel/test_recompute.py``).
"""
import contextlib
from typing import Any, Callable

import torch

from bio_megatron.parallel.device_redirect import note as _note
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)
_TRACKER_CLASS: type | None = None
_DISTOPT_ORIGINALS: dict[str, Callable] = {}  # megatron's methods our distributed-optimizer fixes wrap


class _DummyStream:
    def __init__(self, *a, _quiet: bool = False, **k):
        if not _quiet:  # current_stream()/default_stream() log their own call site
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


def cpu_rng_tracker_class() -> type:
    """megatron's ``CudaRNGStatesTracker`` with CPU generator states (one class per process, so that the seam can
    tell it is ours)."""
    global _TRACKER_CLASS
    if _TRACKER_CLASS is not None:
        return _TRACKER_CLASS
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

    _TRACKER_CLASS = CpuRNGStatesTracker
    return _TRACKER_CLASS


def get_cpu_rng_state(*args, **kwargs) -> torch.Tensor:
    """megatron's ``_get_cuda_rng_state`` (activation recompute): the CPU generator's state."""
    return torch.get_rng_state()


def set_cpu_rng_state(new_state: torch.Tensor, *args, **kwargs) -> None:
    """megatron's ``_set_cuda_rng_state``: restores the CPU generator's state."""
    torch.set_rng_state(new_state)


def install_rng_tracker() -> None:
    import megatron.core.tensor_parallel.random as tpr

    tpr.CudaRNGStatesTracker = cpu_rng_tracker_class()  # picked up by initialize_rng_tracker()
    tpr._get_cuda_rng_state = get_cpu_rng_state
    tpr._set_cuda_rng_state = set_cpu_rng_state
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


def distopt_state_dict(self):
    """``DistributedOptimizer.state_dict`` of a fresh torch-Adam optimizer: its state primed first."""
    prime_adam_state(self.optimizer)
    return _DISTOPT_ORIGINALS["state_dict"](self)


def distopt_set_main_param_and_optimizer_states(self, model_param, tensors):
    """``DistributedOptimizer._set_main_param_and_optimizer_states`` with torch-Adam's ``step`` hidden."""
    gi, go = self.model_param_group_index_map[model_param]
    main_param = self.optimizer.param_groups[gi]["params"][go]
    st = self.optimizer.state[main_param]
    step = st.pop("step", None) if "step" not in tensors else None
    try:
        # no_grad: load_parameter_state_from_dp_reshardable (distrib_optimizer.py:2093) is not
        # decorated with @torch.no_grad() and fp32 main params are views of leaf params.
        with torch.no_grad():
            return _DISTOPT_ORIGINALS["_set_main_param_and_optimizer_states"](self, model_param, tensors)
    finally:
        if step is not None:
            st["step"] = step


def distopt_load_state_dict(self, state_dict):
    """``DistributedOptimizer.load_state_dict`` with one ``step`` tensor per parameter, taken from param_groups."""
    r = _DISTOPT_ORIGINALS["load_state_dict"](self, state_dict)
    # authoritative step = the one stored in param_groups (state_dict() writes it there);
    # 'dp_reshardable' otherwise restores the *pre-load* per-param step tensors (observed: 0.0).
    steps = {g.get("step") for g in state_dict.get("optimizer", {}).get("param_groups", [])}
    steps.discard(None)
    step = float(next(iter(steps))) if len(steps) == 1 else None
    for st in self.optimizer.state.values():
        if torch.is_tensor(st.get("step")):
            # where torch put it: on the CPU, or beside the parameter for a fused/capturable Adam on a GPU
            st["step"] = (torch.tensor(step, dtype=torch.float32, device=st["step"].device) if step is not None
                          else st["step"].detach().clone())
    return r


def patch_torch_adam_distopt_checkpointing():
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
    if D.state_dict is distopt_state_dict:  # installed already
        return
    _DISTOPT_ORIGINALS.update(state_dict=D.state_dict, load_state_dict=D.load_state_dict,
                              _set_main_param_and_optimizer_states=D._set_main_param_and_optimizer_states)
    D.state_dict = distopt_state_dict
    D._set_main_param_and_optimizer_states = distopt_set_main_param_and_optimizer_states
    D.load_state_dict = distopt_load_state_dict


def _logged(name: str, fn: Callable) -> Callable:
    def w(*a, **k):
        _note(f"torch.cuda.{name}()")
        return fn(*a, **k)
    w.__name__ = w.__qualname__ = name
    return w


# The torch.cuda stand-ins, built once so that the seam can check by identity that they are in place.
CUDA_STANDINS: dict[str, Any] = {
    "current_device": _logged("current_device", lambda: 0),
    "synchronize": _logged("synchronize", lambda *a, **k: None),
    "current_stream": _logged("current_stream", lambda *a, **k: _DummyStream(_quiet=True)),
    "default_stream": _logged("default_stream", lambda *a, **k: _DummyStream(_quiet=True)),
    "Stream": _DummyStream,
    "Event": _DummyEvent,
    "stream": _logged("stream", lambda *a, **k: contextlib.nullcontext()),
    "set_device": _logged("set_device", lambda *a, **k: None),
    "get_rng_state": _logged("get_rng_state", lambda *a, **k: torch.get_rng_state()),
    "set_rng_state": _logged("set_rng_state", lambda s, *a, **k: torch.set_rng_state(s)),
    "manual_seed": _logged("manual_seed", lambda seed: None),  # CPU seeding via torch.manual_seed
    "empty_cache": _logged("empty_cache", lambda: None),
}


def install_cuda_standins() -> None:
    """``torch.cuda``'s functions a CPU run of megatron-core calls (no CUDA driver here)."""
    c, s = torch.cuda, CUDA_STANDINS
    c.current_device = s["current_device"]
    c.synchronize = s["synchronize"]
    c.current_stream = s["current_stream"]
    c.default_stream = s["default_stream"]
    c.Stream = s["Stream"]
    c.Event = s["Event"]
    c.stream = s["stream"]
    c.set_device = s["set_device"]
    c.get_rng_state = s["get_rng_state"]
    c.set_rng_state = s["set_rng_state"]
    c.manual_seed = s["manual_seed"]
    c.empty_cache = s["empty_cache"]
