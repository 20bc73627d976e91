"""Numbers that parse but cannot work: sizes below 1, negative counts, rates and probabilities outside their
interval, NaN and Inf. Checked for every model config (pretraining, fine-tuning, distillation) by
``config.pretrain.encoder_problems``; the interval test is shared with the family keys (``config/family_keys.py``). The
configs are typed ``Any`` as in ``config/scale.py``: ``config/pretrain.py`` imports this module."""

from __future__ import annotations

import math
from typing import Any


def outside(value: float, lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = True) -> bool:
    """True unless ``value`` is a finite number in the interval (written so that NaN is always outside)."""
    above = value > lo if lo_open else value >= lo
    below = value < hi if hi_open else value <= hi
    return not (above and below and math.isfinite(value))


def value_problems(m: Any, t: Any) -> list[str]:
    """Sizes, rates and probabilities that parse as numbers but cannot work (negative, zero, NaN, Inf)."""
    o, sc = m.optim, m.optim.sched
    sizes = [("model.num_layers", m.num_layers), ("model.hidden_size", m.hidden_size),
             ("model.ffn_hidden_size", m.ffn_hidden_size), ("model.num_attention_heads", m.num_attention_heads),
             ("model.max_position_embeddings", m.max_position_embeddings),
             ("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by),
             ("model.data.max_ngram", m.data.max_ngram), ("model.optim.sched.decay_steps", sc.decay_steps),
             ("trainer.max_nonfinite_steps", t.max_nonfinite_steps),
             ("model.native_amp_growth_interval", m.native_amp_growth_interval), ("model.hysteresis", m.hysteresis)]
    problems = [f"{k} ({v}) must be >= 1" for k, v in sizes if v is not None and v < 1]
    problems += [f"{k} ({v}) must be >= 0" for k, v in (
        ("model.num_tokentypes", m.num_tokentypes), ("model.optim.sched.warmup_steps", sc.warmup_steps),
        ("model.optim.sched.constant_steps", sc.constant_steps),
        ("trainer.limit_val_batches", t.limit_val_batches)) if v is not None and v < 0]
    # (key, value, low, high, low excluded, high excluded, what is expected)
    ranges = [("model.optim.lr", o.lr, 0.0, math.inf, True, True, "a finite number > 0"),
              ("model.optim.weight_decay", o.weight_decay, 0.0, math.inf, False, True, "a finite number >= 0"),
              ("model.optim.eps", o.eps, 0.0, math.inf, True, True, "a finite number > 0"),
              ("model.native_amp_init_scale", m.native_amp_init_scale, 0.0, math.inf, True, True,
               "a finite number > 0"),
              ("model.min_loss_scale", m.min_loss_scale, 0.0, math.inf, True, True, "a finite number > 0"),
              ("model.optim.sched.min_lr", sc.min_lr, 0.0, math.inf, False, True, "a finite number >= 0"),
              ("model.optim.sched.warmup_ratio", sc.warmup_ratio, 0.0, 1.0, False, True, "in [0, 1)"),
              ("model.hidden_dropout", m.hidden_dropout, 0.0, 1.0, False, True, "in [0, 1)"),
              ("model.attention_dropout", m.attention_dropout, 0.0, 1.0, False, True, "in [0, 1)"),
              ("model.layernorm_epsilon", m.layernorm_epsilon, 0.0, math.inf, True, True, "a finite number > 0"),
              ("model.init_method_std", m.init_method_std, 0.0, math.inf, True, True, "a finite number > 0"),
              ("model.data.short_seq_prob", m.data.short_seq_prob, 0.0, 1.0, False, False, "in [0, 1]"),
              ("trainer.gradient_clip_val", t.gradient_clip_val, 0.0, math.inf, False, True,
               "a finite number >= 0 (0 = no clipping)")]
    ranges += [(f"model.optim.betas[{i}]", b, 0.0, 1.0, False, True, "in [0, 1)")
               for i, b in enumerate(o.betas) if isinstance(b, (int, float))]
    problems += [f"{k} ({v}) must be {what}" for k, v, lo, hi, lo_open, hi_open, what in ranges
                 if v is not None and outside(v, lo, hi, lo_open, hi_open)]
    if not problems and sc.min_lr > o.lr:
        problems.append(f"model.optim.sched.min_lr ({sc.min_lr}) must not exceed model.optim.lr ({o.lr})")
    return problems
