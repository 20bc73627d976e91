"""LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2) as the inner optimizer of
megatron-core's wrappers, so that fp32 main parameters, loss scaling, gradient clipping and the distributed
optimizer's sharding stay megatron's own.

The algorithm, per parameter tensor x with gradient g at step t (``model.optim``: lr, betas, eps, weight_decay):

    m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
    m^ = m / (1 - b1^t)              v^ = v / (1 - b2^t)          (bias_correction; 1 otherwise)
    u = m^ / (sqrt(v^) + eps) + weight_decay x                  (decoupled weight decay, eps outside the root)
    x = x - lr * ratio * u,   ratio = ||x|| / ||u||

Conventions, those of apex's ``FusedLAMB`` (``multi_tensor_lamb``, ``use_nvlamb=False``, ``adam_w_mode=True``,
``grad_averaging=True``): the ratio is 1 when either norm is 0 (a zero-initialised weight takes plain
Adam-sized steps), and 1 for tensors whose weight decay is 0 (megatron's groups: biases and LayerNorm
parameters), as the original BERT/ALBERT LAMB excludes them from layer adaptation; phi is the identity (no
clamp). Global gradient clipping is megatron's (``trainer.gradient_clip_val``), never a second one here.
Unlike TF ALBERT's LAMB, bias correction is on by default (apex's default); ``model.optim.bias_correction:
false`` gives the TF update.

The norms are those of the whole parameter, whatever the layout (:class:`WholeParamNorms`): a TP-split
tensor's squared norm is summed over the tensor-parallel group, a distributed-optimizer shard's over the
data-parallel group, and the vocabulary padding rows (which differ between layouts and are never used) are
left out, so TP2 and DP2 + distributed optimizer take the TP1 steps.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import torch
import torch.distributed as dist

from bio_megatron.config.pretrain import OptimConfig
from bio_megatron.utils.log import get_logger

class LocalNorms:
    """Each tensor's own L2 norm (one process holding whole parameters). A norms object is used in two phases:
    ``partial`` per tensor while its update exists, then one ``reduce`` for all of them."""

    def partial(self, p: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Squared norms of this rank's counted part of ``p`` and of its update ``u`` (float64)."""
        return p.double().square().sum(), u.double().square().sum()

    def reduce(self, params: list[torch.Tensor], sq_w: list[torch.Tensor],
               sq_u: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(||p||, ||u||) for each of ``params`` from the partial squared norms."""
        if not params:
            empty = torch.zeros(0, dtype=torch.float64)
            return empty, empty
        return torch.stack(sq_w).sqrt(), torch.stack(sq_u).sqrt()


class Lamb(torch.optim.Optimizer):
    """LAMB over plain tensors; ``norms`` says how a tensor's norm is taken (default: :class:`LocalNorms`).

    State per tensor is Adam's (``exp_avg``, ``exp_avg_sq``, ``step``), so megatron-core's checkpointing of the
    (distributed) optimizer stores and restores it as it does torch's Adam; the step count also lives in each
    param group (``step``), as apex's optimizers keep it, and is read from there. Memory is Adam's: an update
    exists for one tensor at a time (computed once for its norm, then again, identically, to apply it once all
    norms are known), where holding all of them would add 4 bytes per parameter."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 norms: LocalNorms | None = None):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.norms = norms or LocalNorms()

    @torch.no_grad()
    def init_state(self) -> None:
        """Allocate the state a first step would (zero moments, step 0): megatron-core's checkpointing of the
        distributed optimizer reads it before a load or a save of an optimizer that has not stepped yet."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] = torch.tensor(float(group.get("step", 0)))

    @staticmethod
    def _update(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, group: dict, bc1: float,
                bc2: float) -> torch.Tensor:
        """m^ / (sqrt(v^) + eps) + weight_decay * p, a new tensor."""
        u = (m / bc1).div_((v / bc2).sqrt_().add_(group["eps"]))
        if group["weight_decay"] != 0:
            u.add_(p, alpha=group["weight_decay"])
        return u

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        adapted: list[tuple[torch.Tensor, dict, float, float]] = []  # tensors whose ratio needs the norms
        sq_w: list[torch.Tensor] = []
        sq_u: list[torch.Tensor] = []
        for group in self.param_groups:
            step = int(group.get("step", 0)) + 1
            group["step"] = step
            b1, b2 = group["betas"]
            bc1, bc2 = (1.0 - b1 ** step, 1.0 - b2 ** step) if group["bias_correction"] else (1.0, 1.0)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                # A fresh tensor every step: megatron's distributed-optimizer load gives all states one shared
                # step tensor, which an in-place increment would advance once per parameter.
                state["step"] = torch.tensor(float(step))
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                u = self._update(p, m, v, group, bc1, bc2)
                if group["weight_decay"] == 0:  # no layer adaptation: ratio 1
                    p.add_(u, alpha=-group["lr"])
                    continue
                w2, u2 = self.norms.partial(p, u)
                adapted.append((p, group, bc1, bc2))
                sq_w.append(w2)
                sq_u.append(u2)
        # One reduction for all adapted tensors, on every rank even with none: a collective when layout-aware.
        w_norm, u_norm = self.norms.reduce([p for p, _, _, _ in adapted], sq_w, sq_u)
        ratios = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm.clamp_min(torch.finfo(u_norm.dtype).tiny),
                             torch.ones_like(w_norm))
        for (p, group, bc1, bc2), ratio in zip(adapted, ratios):
            state = self.state[p]
            u = self._update(p, state["exp_avg"], state["exp_avg_sq"], group, bc1, bc2)
            p.add_(u.mul_(ratio.to(u.dtype)), alpha=-group["lr"])
        return loss


class Span(NamedTuple):
    index: int  # the model parameter's position, the same on every rank of the TP and DP groups
    lo: int  # elements [lo, hi) of the flattened tensor are real parameter entries (not vocabulary padding)
    hi: int
    counted: bool  # False for a TP-replicated tensor on TP ranks > 0 (rank 0 speaks for the group)


class WholeParamNorms(LocalNorms):
    """Norms of whole parameters from the pieces each rank holds: squared norms are placed at the parameter's
    index in a vector, summed over the tensor-parallel group (TP-split tensors; replicated ones counted once) and
    over the data-parallel group (distributed-optimizer shards), then square-rooted."""

    def __init__(self, spans: dict[torch.Tensor, Span], size: int, device: torch.device,
                 tp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None):
        self.spans, self.size, self.device = spans, size, device
        self.tp_group, self.dp_group = tp_group, dp_group

    def partial(self, p: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spans[p]
        if not s.counted or s.hi <= s.lo:
            zero = torch.zeros((), dtype=torch.float64, device=p.device)
            return zero, zero
        # float64 so that summing partial squares in another order (another layout) changes nothing visible
        return (p.reshape(-1)[s.lo:s.hi].double().square().sum(), u.reshape(-1)[s.lo:s.hi].double().square().sum())

    def reduce(self, params: list[torch.Tensor], sq_w: list[torch.Tensor],
               sq_u: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        sq = torch.zeros(2, self.size, dtype=torch.float64, device=self.device)
        pick = torch.tensor([self.spans[p].index for p in params], dtype=torch.long, device=self.device)
        if params:  # each parameter appears once per rank: a plain scatter
            sq[0, pick] = torch.stack(sq_w).to(self.device)
            sq[1, pick] = torch.stack(sq_u).to(self.device)
        for group in (self.tp_group, self.dp_group):
            if group is not None:
                dist.all_reduce(sq, group=group)
        norms = sq.sqrt()
        return norms[0, pick], norms[1, pick]


def _inner_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _main_params(wrapper) -> list[tuple[torch.nn.Parameter, torch.Tensor, int]]:
    """(model parameter, the tensor the inner optimizer updates for it, that tensor's first element's offset in
    the flattened model parameter) for each of megatron's wrappers."""
    if hasattr(wrapper, "shard_fp32_from_float16_groups"):  # DistributedOptimizer: flat shards of each parameter
        pairs = [pair for gm, gs in zip(wrapper.model_float16_groups, wrapper.shard_fp32_from_float16_groups)
                 for pair in zip(gm, gs)]
        pairs += [pair for gm, gs in zip(wrapper.model_fp32_groups, wrapper.shard_fp32_groups) for pair in zip(gm, gs)]
        return [(mp, sp, wrapper._get_model_param_range_map(mp)["param"].start) for mp, sp in pairs]
    if hasattr(wrapper, "fp32_from_float16_groups"):  # Float16OptimizerWithFloat16Params: fp32 copies
        pairs = [pair for gm, gs in zip(wrapper.float16_groups, wrapper.fp32_from_float16_groups)
                 for pair in zip(gm, gs)]
        pairs += [(p, p) for g in wrapper.fp32_from_fp32_groups for p in g]
        return [(mp, sp, 0) for mp, sp in pairs]
    return [(p, p, 0) for g in wrapper.optimizer.param_groups for p in g["params"]]  # FP32Optimizer


def real_rows(model_chunks: list) -> dict[torch.nn.Parameter, int]:
    """Vocabulary-sized weights (the word embedding, an untied output layer) -> how many of this rank's rows
    are real tokens; the rest is megatron's padding to a multiple of 128 x TP, a different amount per layout."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding

    true = next((m.true_vocab_size for c in model_chunks for m in c.modules()
                 if getattr(m, "true_vocab_size", None) is not None), None)
    if true is None:
        return {}
    out = {}
    for chunk in model_chunks:
        for name, mod in chunk.named_modules():
            weight = getattr(mod, "weight", None)
            if isinstance(mod, VocabParallelEmbedding):
                start = mod.vocab_start_index
            elif isinstance(mod, ColumnParallelLinear) and name.endswith("output_layer") and weight is not None:
                start = ps.get_tensor_model_parallel_rank() * weight.shape[0]
            else:
                continue
            out[weight] = max(0, min(weight.shape[0], true - start))
    return out


def whole_param_norms(optimizer, model_chunks: list) -> tuple[dict[int, WholeParamNorms], bool]:
    """A :class:`WholeParamNorms` per inner optimizer of megatron's ``optimizer`` (by position), and whether
    any norm needs more than the local tensor (a collective or leaving out padding rows)."""
    from megatron.core import parallel_state as ps

    canonical = [p for chunk in model_chunks for p in chunk.parameters()]
    index = {p: i for i, p in enumerate(canonical)}
    rows = real_rows(model_chunks)
    tp = ps.get_tensor_model_parallel_world_size()
    tp_group = ps.get_tensor_model_parallel_group() if tp > 1 else None
    tp_rank = ps.get_tensor_model_parallel_rank() if tp > 1 else 0
    device = canonical[0].device if canonical else torch.device("cpu")
    out, needs_more = {}, tp > 1
    for k, wrapper in enumerate(_inner_optimizers(optimizer)):
        if getattr(wrapper, "optimizer", None) is None:
            continue
        dp_group = getattr(wrapper, "data_parallel_group", None) if hasattr(wrapper, "shard_fp32_groups") else None
        if dp_group is not None and dist.get_world_size(dp_group) > 1:
            needs_more = True
        else:
            dp_group = None
        spans = {}
        for mp, main, start in _main_params(wrapper):
            width = mp[0].numel() if mp.dim() > 1 else 1
            real = rows.get(mp, mp.shape[0] if mp.dim() else 1) * width
            if real < mp.numel():
                needs_more = True
            split = bool(getattr(mp, "tensor_model_parallel", False))
            spans[main] = Span(index[mp], 0, max(0, min(main.numel(), real - start)), split or tp_rank == 0)
        out[k] = WholeParamNorms(spans, len(canonical), device, tp_group, dp_group)
    return out, needs_more


def _apex_lamb() -> type | None:
    """apex's FusedLAMB class where apex and its CUDA extension (``amp_C``, which the class needs) import."""
    try:
        import amp_C  # noqa: F401
        from apex.optimizers import FusedLAMB
    except Exception:  # apex absent, or built without its CUDA extensions
        return None
    return FusedLAMB


def install_lamb(optimizer, optim: OptimConfig, model_chunks: list) -> str:
    """Replace the torch/TE/apex Adam that ``get_megatron_optimizer`` built inside each of megatron's wrappers
    (built for ``optimizer="adam"`` so that its param groups, fp32 main parameters, buffers and sharding are
    megatron's) by LAMB over the same param-group dicts, which the wrappers and the LR scheduler keep using.

    apex's ``FusedLAMB`` runs where it is importable, the parameters are on a GPU and every norm is a local
    tensor's own (TP1, no distributed optimizer, no vocabulary padding); its own global-norm clipping is
    disabled (``max_grad_norm=inf``: megatron clips). Otherwise :class:`Lamb` with :class:`WholeParamNorms`.
    Returns the kernel used: ``"apex"`` or ``"torch"``."""
    norms, needs_more = whole_param_norms(optimizer, model_chunks)
    fused = _apex_lamb()
    on_gpu = any(p.is_cuda for c in model_chunks for p in c.parameters())
    kernel = "apex" if fused is not None and on_gpu and not needs_more else "torch"
    adam_only = ("amsgrad", "foreach", "maximize", "capturable", "differentiable", "fused", "decoupled_weight_decay",
                 "adam_w_mode", "bias_correction")
    for k, wrapper in enumerate(_inner_optimizers(optimizer)):
        inner = getattr(wrapper, "optimizer", None)
        if inner is None:  # a rank without trainable parameters keeps megatron's stub
            continue
        groups = inner.param_groups
        for g in groups:  # the same dict objects stay: the distributed optimizer and the scheduler hold them
            for key in adam_only:
                g.pop(key, None)
        if kernel == "apex":
            wrapper.optimizer = fused(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                      weight_decay=optim.weight_decay, bias_correction=optim.bias_correction,
                                      max_grad_norm=float("inf"), adam_w_mode=True, grad_averaging=True,
                                      use_nvlamb=False, set_grad_none=False)
        else:
            # Built on a placeholder, then given the groups: the distributed optimizer's fp32 shards are views of
            # the model parameters (non-leaf), which torch's add_param_group refuses; megatron-core assigns its
            # Adam's param_groups directly for the same reason.
            lamb = Lamb([torch.zeros(1, requires_grad=True)], lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                        weight_decay=optim.weight_decay, bias_correction=optim.bias_correction, norms=norms.get(k))
            for g in groups:
                for key, value in lamb.defaults.items():
                    g.setdefault(key, value)
            lamb.param_groups = groups
            lamb.init_state()
            wrapper.optimizer = lamb
    get_logger().info("optimizer: LAMB (%s kernel, bias correction %s)", kernel,
                      "on" if optim.bias_correction else "off")
    return kernel
