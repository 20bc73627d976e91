"""megatron-core optimizer (Adam/AdamW or LAMB, weight decay, grad clipping, optional distributed optimizer)
and its LR scheduler (warmup, then linear/cosine decay)."""

from __future__ import annotations

import torch
from megatron.core import parallel_state as ps
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer, get_standard_config_overrides
from megatron.core.optimizer.optimizer_config import ParamKey, ParamPredicate
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.transformer_layer import TransformerLayer

from bio_megatron.config.pretrain import ModelConfig, OptimConfig
from bio_megatron.training.lamb import install_lamb


def build_optimizer(optim: OptimConfig, model_chunks: list, dtype: torch.dtype, clip_grad: float,
                    use_distributed_optimizer: bool, scaler: ModelConfig | None = None):
    """megatron-core's optimizer for ``dtype``: fp32, or bf16/fp16 weights with fp32 main parameters (its
    mixed-precision optimizers); fp16 adds its ``DynamicGradScaler`` with NeMo's knobs from ``scaler``
    (``native_amp_init_scale``, ``native_amp_growth_interval``, ``hysteresis``, ``min_loss_scale``)."""
    amp = scaler or ModelConfig()
    cfg = OptimizerConfig(
        optimizer="adam", lr=optim.lr, min_lr=optim.sched.min_lr, weight_decay=optim.weight_decay,
        # NeMo's fused_adam and adamw decouple weight decay (AdamW), as LAMB does; plain "adam" adds it to the gradient.
        decoupled_weight_decay=optim.name != "adam",
        adam_beta1=optim.betas[0], adam_beta2=optim.betas[1], adam_eps=optim.eps, clip_grad=clip_grad,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
        use_distributed_optimizer=use_distributed_optimizer,
        initial_loss_scale=amp.native_amp_init_scale, loss_scale_window=amp.native_amp_growth_interval,
        hysteresis=amp.hysteresis, min_loss_scale=amp.min_loss_scale,
    )
    decay = getattr(optim, "layerwise_lr_decay", None)  # fine-tuning configs only (config/finetune.py)
    overrides = None if decay is None else layerwise_overrides(cfg, model_chunks, decay)
    optimizer = get_megatron_optimizer(cfg, model_chunks, overrides)
    if optim.name == "lamb":
        # megatron-core builds Adam only (or SGD); LAMB replaces it inside megatron's own wrappers.
        install_lamb(optimizer, optim, model_chunks)
    else:
        choose_adam_kernel(optimizer, optim.fused)
    if loss_scale(optimizer) is not None:
        # The pipeline schedules multiply each micro-batch's loss by config.grad_scale_func before backward
        # (Megatron-LM's trainer wires it the same way); without it the optimizer would unscale gradients
        # that were never scaled. Left unset otherwise: fp32/bf16 losses stay untouched.
        for chunk in model_chunks:
            chunk.config.grad_scale_func = optimizer.scale_loss
    return optimizer


def layer_depths(model_chunks: list) -> tuple[dict[int, int], int]:
    """Each parameter's depth as ELECTRA's fine-tuning code counts it (``_get_layer_lrs`` in its
    ``model/optimization.py``), keyed by ``id(param)``, and the encoder's global layer count L: 0 for the embeddings
    (ELECTRA's ``/embeddings/`` and ``/embeddings_project/``), l + 1 for transformer layer l (0-based GLOBAL index:
    megatron's ``layer_number`` is 1-based and already includes this pipeline stage's offset, so on the second of
    two stages the first local layer is global layer L/2), L + 2 for everything else (ELECTRA's ``task_specific/``:
    the head, and here also pre-LN's final LayerNorm). Depth L + 1 is unused, as in ELECTRA.

    A layer applied at several depths (ALBERT's one shared layer: fewer layers than ``num_layers`` on a single
    stage) has no depth: ValueError (config/finetune.py refuses the key for such families first)."""
    num_layers, in_layer, numbers = 0, {}, set()
    for chunk in model_chunks:
        for mod in chunk.modules():
            if isinstance(mod, TransformerLayer):
                num_layers = mod.config.num_layers  # global, the same in every layer
                numbers.add(mod.layer_number)
                for p in mod.parameters():
                    in_layer[id(p)] = mod.layer_number
    if not num_layers:
        raise ValueError("model.optim.layerwise_lr_decay: no megatron-core TransformerLayer in the model")
    if ps.get_pipeline_model_parallel_world_size() == 1 and len(numbers) < num_layers:
        raise ValueError(f"model.optim.layerwise_lr_decay: the model's {len(numbers)} transformer layer(s) run at "
                         f"{num_layers} depths (shared weights): no depth gives them a rate")
    depths = {}
    for chunk in model_chunks:
        for name, p in chunk.named_parameters():
            if id(p) in in_layer:
                depths[id(p)] = in_layer[id(p)]
            elif any(part.startswith("embedding") for part in name.split(".")):
                depths[id(p)] = 0
            else:
                depths[id(p)] = num_layers + 2
    return depths, num_layers


def layerwise_overrides(cfg: OptimizerConfig, model_chunks: list, decay: float) -> dict:
    """megatron-core's standard overrides (no weight decay on biases and norms) plus, per depth d, the learning
    rate ``lr * decay ** (L + 2 - d)`` as the group's ``max_lr``/``min_lr`` (the scheduler computes every group's
    lr from these, so warm-up and decay keep the ratios) and ``lr_mult`` (megatron's record of the factor). Every
    rank declares every depth (megatron aligns param groups across ranks; a PP stage's empty groups are harmless)."""
    depths, num_layers = layer_depths(model_chunks)
    overrides = get_standard_config_overrides(cfg)
    for depth in [0, *range(1, num_layers + 1), num_layers + 2]:
        ids = frozenset(i for i, d in depths.items() if d == depth)
        mult = decay ** (num_layers + 2 - depth)
        key = ParamKey(predicate=ParamPredicate(name=f"layerwise_lr_depth_{depth}",
                                                fn=lambda p, ids=ids: id(p) in ids))
        # megatron orders the groups by their sorted override items: "layerwise_rank" sorts first, so group 0 (the
        # rate the step line and metrics.jsonl report) is the head's, the configured model.optim.lr
        overrides[key] = {"layerwise_rank": num_layers + 2 - depth, "max_lr": cfg.lr * mult,
                          "min_lr": cfg.min_lr * mult, "lr_mult": mult}
    return overrides


def torch_adams(optimizer) -> list[torch.optim.Optimizer]:
    """The ``torch.optim.Adam``/``AdamW`` instances inside megatron's (chained, mixed-precision) wrappers; empty
    when megatron-core runs Transformer Engine's or apex's FusedAdam."""
    inner = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    return [o for o in inner if isinstance(o, (torch.optim.Adam, torch.optim.AdamW))]


def choose_adam_kernel(optimizer, fused: bool | None) -> str | None:
    """Run torch's fused Adam kernel (one pass over memory per parameter tensor) where megatron-core fell back to
    torch's Adam, which it builds without ``fused=`` (single-tensor on CPU, foreach on GPU).

    ``fused`` is ``model.optim.fused``: None or True = fused, on CPU and GPU (on an H100 its step took 11-14 ms where
    foreach took 16-21 ms, 345m, 2026-11-27); False = torch's default (single-tensor on CPU, foreach on GPU: the
    kernel of runs before 2026-11-23 on CPU, before 2026-11-27 on GPU). The fused kernel rounds differently in the last
    bits (measured in docs/BENCHMARKS.md), so the choice is re-applied before every step: a checkpoint's
    ``param_groups`` (``load_state_dict`` takes them whole) then never switch a run's kernel behind its back.
    Returns the kernel chosen, or None when megatron-core runs no torch Adam (TE/apex FusedAdam)."""
    adams = torch_adams(optimizer)
    if not adams:
        return None
    params = [p for o in adams for g in o.param_groups for p in g["params"]]
    want = fused is not False
    if want:
        bad = sorted({f"{p.dtype} on {p.device}" for p in params if p.is_sparse or not p.is_floating_point()})
        if bad:
            raise ValueError(f"model.optim.fused: torch's fused Adam needs dense floating-point parameters, got {bad}")

    def apply(opt: torch.optim.Optimizer, *_args) -> None:
        for group in opt.param_groups:
            group["fused"], group["foreach"] = (True, False) if want else (None, None)

    for opt in adams:
        apply(opt)
        opt.register_step_pre_hook(apply)
    return "fused" if want else "default"


def warmup_steps(optim: OptimConfig, max_steps: int) -> int:
    s = optim.sched
    if s.warmup_steps is not None:
        return s.warmup_steps
    if s.warmup_ratio is not None:
        return int(round(s.warmup_ratio * max_steps))
    return 0


RATE_KEYS = ("max_lr", "min_lr", "start_wd", "end_wd")


def _param_group_lists(state) -> list[list[dict]]:
    """Every ``param_groups`` list inside an optimizer state dict (megatron's wrappers nest torch's)."""
    if isinstance(state, dict):
        found = [state["param_groups"]] if isinstance(state.get("param_groups"), list) else []
        return found + [g for k, v in state.items() if k != "param_groups" for g in _param_group_lists(v)]
    if isinstance(state, (list, tuple)):
        return [g for v in state for g in _param_group_lists(v)]
    return []


class Schedule(OptimizerParamScheduler):
    """megatron-core's scheduler with the resume rules of this project (docs/RELIABILITY.md):

    - the decay length follows ``trainer.max_steps``: where ``model.optim.sched.decay_steps`` is not set, a resumed
      run decays over ITS max_steps (minus ``constant_steps``), not the checkpoint's; LR, minimum, warm-up and style
      stay the checkpoint's (they are checked equal, warm-up steps as the checkpoint counted them). So the LR at
      step s of a run extended from N to 2N steps is the LR a run planned for 2N steps has at s (same warm-up);
    - ``model.optim.sched.override_opt_param_scheduler`` (Megatron-LM's ``--override-opt_param-scheduler``): the
      schedule is this run's config (LR, minimum, warm-up, decay length and style, weight decay), each param group's
      rate included; only the step count comes from the checkpoint."""

    def __init__(self, optimizer, *, follow_max_steps: bool, **kwargs) -> None:
        self.follow_max_steps = follow_max_steps
        super().__init__(optimizer, **kwargs)

    def prepare_optimizer_state(self, state: dict) -> None:
        """Called on the optimizer's saved state before it is loaded: with the override, the saved param groups
        take this run's rates. megatron-core matches saved to current groups by their rates (``max_lr``, ...), so
        another LR would otherwise fail the load; the groups are built in the same order, so they pair by position."""
        if not self.override_opt_param_scheduler:
            return
        mine = self.optimizer.param_groups
        for groups in _param_group_lists(state):
            if len(groups) == len(mine):
                for saved, current in zip(groups, mine):
                    saved.update({k: current[k] for k in RATE_KEYS if k in current})

    def load_state_dict(self, state_dict: dict) -> None:
        decay = self.lr_decay_steps
        super().load_state_dict(state_dict)
        if self.follow_max_steps and self.lr_decay_steps != decay:
            self.lr_decay_steps = max(decay, self.lr_warmup_steps + 1)
            self.step(0)


class SquareRootAnnealing(Schedule):
    """NeMo's SquareRootAnnealing after warmup: max(lr * sqrt((max_steps - step) / max_steps), min_lr), with
    step and max_steps counted from 0 (NeMo does not subtract the warmup here); megatron's warmup before."""

    def get_lr(self, param_group: dict) -> float:
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return super().get_lr(param_group)
        max_lr = param_group.get("max_lr", self.max_lr)
        min_lr = param_group.get("min_lr", self.min_lr)
        left = max(self.lr_decay_steps - self.num_steps, 0)
        return max(max_lr * (left / self.lr_decay_steps) ** 0.5, min_lr)


def build_scheduler(optimizer, optim: OptimConfig, max_steps: int) -> OptimizerParamScheduler:
    s = optim.sched
    # NeMo's WarmupAnnealing is a linear decay to min_lr at max_steps; SquareRootAnnealing overrides get_lr.
    style = {"CosineAnnealing": "cosine", "cosine": "cosine", "linear": "linear", "constant": "constant",
             "WarmupAnnealing": "linear", "SquareRootAnnealing": "linear"}[s.name]
    warm = warmup_steps(optim, max_steps)
    decay = s.decay_steps if s.decay_steps is not None else max_steps - (s.constant_steps or 0)
    # megatron counts decay steps from 0 including warmup; keep decay >= warmup so the schedule is defined.
    cls = SquareRootAnnealing if s.name == "SquareRootAnnealing" else Schedule
    override = bool(getattr(s, "override_opt_param_scheduler", False))
    return cls(
        optimizer, init_lr=0.0 if warm else optim.lr, max_lr=optim.lr, min_lr=s.min_lr,
        lr_warmup_steps=warm, lr_decay_steps=max(decay, warm + 1), lr_decay_style=style,
        start_wd=optim.weight_decay, end_wd=optim.weight_decay, wd_incr_steps=max(1, max_steps),
        wd_incr_style="constant", use_checkpoint_opt_param_scheduler=not override,
        override_opt_param_scheduler=override, follow_max_steps=s.decay_steps is None,
    )


def loss_scale(optimizer) -> float | None:
    """The fp16 loss scaler's current scale, or None when there is no scaler (fp32, bf16)."""
    scalers = [o.grad_scaler for o in getattr(optimizer, "chained_optimizers", [optimizer])
               if getattr(o, "grad_scaler", None) is not None]
    return float(scalers[0].scale.item()) if scalers else None
