"""Experiment trackers as NeMo's ``exp_manager`` sets them up: Weights & Biases and MLflow.

``exp_manager.create_wandb_logger`` / ``wandb_logger_kwargs`` and ``create_mlflow_logger`` /
``mlflow_logger_kwargs`` take the keyword arguments of PyTorch Lightning's ``WandbLogger`` and ``MLFlowLogger``
(which NeMo builds from them), so a NeMo config's logger block works unchanged. Each tracker gets the resolved
config (W&B ``config``, MLflow params) and every record the run writes to ``metrics.jsonl`` (step lines and
evaluations), from rank 0 only. The packages are optional extras (``pip install 'bio-megatron[wandb]'``,
``'[mlflow]'``); without network, ``WANDB_MODE=offline`` (or ``wandb_logger_kwargs.offline: true``) and MLflow's
local file store (its default here: ``<run>/mlruns``) keep everything on disk.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import time
from pathlib import Path

from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

log = get_logger(__name__)

# Lightning keys with no meaning here (no model artifacts are uploaded; our checkpoints stay in the run folder).
_NO_EFFECT = {"log_model", "checkpoint_name", "experiment", "anonymous", "synchronous"}
# Lightning's WandbLogger keys that are not wandb.init's own (save_dir/version/offline/prefix are mapped below).
_WANDB_LIGHTNING = {"save_dir", "version", "offline", "prefix"} | _NO_EFFECT
_MLFLOW_KEYS = {"experiment_name", "run_name", "tracking_uri", "tags", "save_dir", "prefix", "artifact_location",
                "run_id"} | _NO_EFFECT


def _need(package: str, key: str, extra: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"exp_manager.{key} is true but the {package} package is not installed: "
                          f"pip install 'bio-megatron[{extra}]' (or set exp_manager.{key}=false)")


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _numbers(values: dict, prefix: str) -> dict[str, float]:
    return {f"{prefix}{k}": float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class _Wandb:
    def __init__(self, kwargs: dict, run_dir: Path, name: str, project: str, config: dict):
        import wandb

        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # NeMo's configs say name: null, project: null

        kw = {k: v for k, v in kwargs.items() if k not in _WANDB_LIGHTNING}
        kw.setdefault("name", name)
        kw.setdefault("project", project)
        kw["dir"] = str(kwargs.get("save_dir") or kw.get("dir") or run_dir)
        Path(kw["dir"]).mkdir(parents=True, exist_ok=True)
        if kwargs.get("version") is not None:
            kw.setdefault("id", str(kwargs["version"]))
        if kwargs.get("offline"):
            kw["mode"] = "offline"
        # console="off": wandb would otherwise wrap stdout/stderr (our JSON summary goes to stdout)
        kw.setdefault("settings", wandb.Settings(console="off", silent=True))
        self.prefix = f"{kwargs['prefix']}-" if kwargs.get("prefix") else ""
        self.run = wandb.init(config=config, **kw)
        log.info("W&B run %s (%s mode) in %s", self.run.id, self.run.settings.mode, kw["dir"])

    def log(self, step: int, values: dict) -> None:
        self.run.log(_numbers(values, self.prefix), step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class _Mlflow:
    def __init__(self, kwargs: dict, run_dir: Path, name: str, experiment: str, params: dict):
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        save_dir = Path(kwargs.get("save_dir") or run_dir / "mlruns")
        uri = kwargs.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{save_dir.resolve()}"
        if uri.startswith("file:"):  # the local file store, Lightning's default; MLflow 3 asks for this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self.client = MlflowClient(uri)
        self.prefix = f"{kwargs['prefix']}-" if kwargs.get("prefix") else ""
        if kwargs.get("run_id"):
            self.run_id = str(kwargs["run_id"])
        else:
            exp_name = kwargs.get("experiment_name") or experiment
            exp = self.client.get_experiment_by_name(exp_name)
            exp_id = exp.experiment_id if exp is not None else \
                self.client.create_experiment(exp_name, artifact_location=kwargs.get("artifact_location"))
            tags = {str(k): str(v) for k, v in (kwargs.get("tags") or {}).items()}
            self.run_id = self.client.create_run(exp_id, run_name=kwargs.get("run_name") or name, tags=tags).info.run_id
        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("bio_megatron.run_dir", str(run_dir))])
        log.info("MLflow run %s at %s", self.run_id, uri)

    def log(self, step: int, values: dict) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, step) for k, v in _numbers(values, self.prefix).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class Trackers:
    """The W&B and MLflow runs of one training run (none open on other ranks than the writer)."""

    def __init__(self, trackers: list):
        self._trackers = trackers

    def log(self, step: int, values: dict) -> None:
        for t in self._trackers:
            t.log(step, values)

    def close(self, failed: bool = False) -> None:
        for t in self._trackers:
            t.close(failed)
        self._trackers = []


def tracker_problems(e) -> list[str]:
    """Keys of ``wandb_logger_kwargs`` / ``mlflow_logger_kwargs`` that neither the tracker nor Lightning knows."""
    problems = []
    for key in ("wandb_logger_kwargs", "mlflow_logger_kwargs"):
        kwargs = getattr(e, key)
        if kwargs is not None and not isinstance(kwargs, dict):
            problems.append(f"exp_manager.{key} ({kwargs!r}) must be a mapping of the logger's keyword arguments")
    if e.create_mlflow_logger and isinstance(e.mlflow_logger_kwargs, dict):
        unknown = sorted(set(e.mlflow_logger_kwargs) - _MLFLOW_KEYS)
        if unknown:
            problems.append(f"exp_manager.mlflow_logger_kwargs: unknown key(s) {', '.join(unknown)}; expected "
                            f"{', '.join(sorted(_MLFLOW_KEYS - _NO_EFFECT))}")
    return problems


def open_trackers(cfg, run_dir: Path, is_writer: bool, config: dict) -> Trackers:
    """The trackers ``cfg.exp_manager`` asks for, opened on the writing rank. Every rank checks the keys and that
    the packages are installed first, so that a problem stops all ranks alike (exit 2)."""
    e = cfg.exp_manager
    problems = tracker_problems(e)
    if e.create_wandb_logger:
        _need("wandb", "create_wandb_logger", "wandb")
        import wandb

        known = set(inspect.signature(wandb.init).parameters) | _WANDB_LIGHTNING
        unknown = sorted(set(e.wandb_logger_kwargs or {}) - known) if isinstance(e.wandb_logger_kwargs, dict) else []
        if unknown:
            problems.append(f"exp_manager.wandb_logger_kwargs: unknown key(s) {', '.join(unknown)}; expected "
                            "wandb.init's arguments or Lightning WandbLogger's (save_dir, version, offline, prefix)")
    if e.create_mlflow_logger:
        _need("mlflow", "create_mlflow_logger", "mlflow")
    if problems:
        raise ConfigError(problems)
    ignored = sorted(k for kw in (e.wandb_logger_kwargs or {}, e.mlflow_logger_kwargs or {}) for k in kw
                     if k in _NO_EFFECT)
    if ignored and is_writer:
        log.warning("exp_manager logger key(s) %s have no effect here: no model artifacts are uploaded (the "
                    "checkpoints stay in the run folder)", ", ".join(ignored))
    opened: list = []
    if is_writer:
        name = str(e.name)
        if e.create_wandb_logger:
            opened.append(_Wandb(dict(e.wandb_logger_kwargs or {}), run_dir, name, str(cfg.name), config))
        if e.create_mlflow_logger:
            opened.append(_Mlflow(dict(e.mlflow_logger_kwargs or {}), run_dir, name, str(cfg.name), _flat(config)))
    return Trackers(opened)
