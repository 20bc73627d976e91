"""Early stopping with patience, as Lightning's ``EarlyStopping`` callback that NeMo's exp_manager builds from
``exp_manager.create_early_stopping_callback`` + ``early_stopping_callback_params`` (bio-lm stops classification
early on dev, paper 004 §5.2): after each dev evaluation the monitored value improves when it beats the best so
far by more than ``min_delta`` (``mode`` min: lower, max: higher); after ``patience`` evaluations in a row without
improvement the run ends. The checkpoint kept is still the best one by the task's dev metric (tasks/finetune.py),
so stopping only saves the remaining steps. Its state is a replay of the run's history, so a resumed run stops
exactly where an uninterrupted one would."""

from __future__ import annotations

import math

from bio_megatron.config.finetune import FinetuneConfig
from bio_megatron.utils.errors import ConfigError


def monitor_key(cfg: FinetuneConfig, metric: str) -> str | None:
    """The history key early stopping watches (``val_loss`` or ``dev_<metric>``), None when it is off. NeMo names
    the metric ``val_<metric>``; ``dev_<metric>`` (our metrics.jsonl) is accepted too. Anything else is refused in
    one line naming what the task offers."""
    e = cfg.exp_manager
    if not e.create_early_stopping_callback:
        return None
    monitor = e.early_stopping_callback_params.monitor
    if monitor == "val_loss":
        return "val_loss"
    if monitor in (f"val_{metric}", f"dev_{metric}"):
        return f"dev_{metric}"
    raise ConfigError(f"exp_manager.early_stopping_callback_params.monitor ({monitor}) is not logged by "
                      f"finetune {cfg.task}: expected val_loss or val_{metric}")


class EarlyStopping:
    """Lightning's rule: improved if ``value < best - min_delta`` (min) or ``value > best + min_delta`` (max)."""

    def __init__(self, cfg: FinetuneConfig, metric: str):
        p = cfg.exp_manager.early_stopping_callback_params
        self.key, self.mode, self.min_delta, self.patience = monitor_key(cfg, metric), p.mode, p.min_delta, p.patience
        self.best = math.inf if p.mode == "min" else -math.inf
        self.wait = 0

    def update(self, record: dict) -> bool:
        """One dev evaluation's record (``val_loss``, ``dev_<metric>``); True when the run should stop now."""
        if self.key is None or self.key not in record:
            return False
        value = float(record[self.key])
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best, self.wait = value, 0
        else:
            self.wait += 1  # a NaN never improves
        return self.wait >= self.patience

    def replay(self, history: list[dict]) -> None:
        """The state after the dev evaluations of a resumed run's history."""
        for record in history:
            self.update(record)
