"""Typed configs from YAML documents loaded with OmegaConf (as NeMo's are), with ``key=value`` overrides.

A recipe is a thin delta on a base (``defaults: [_base]`` names sibling files merged first, our convention).
Precedence, lowest first: the ``defaults`` chain in order, the file itself, then the command line in order.
Interpolation (``${...}``, NeMo's ``${multiply:...}``) is resolved after the command line is merged, so a
reference sees the overridden value, as under Hydra. NeMo's own key names are then mapped to ours
(``nemo_compat``). Dataclasses mirror the result; unknown keys and wrong types are collected and reported
together, quoting the key path and the value.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bio_megatron.config import nemo_compat
from bio_megatron.utils.errors import ConfigError
from bio_megatron.utils.log import get_logger

T = TypeVar("T")
log = get_logger(__name__)


def deep_merge(base: dict, delta: dict) -> dict:
    out = dict(base)
    for k, v in delta.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _load_file(path: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: expected a mapping at the top level, got a list")
    return cfg


def load_recipe(path: str | Path, _seen: tuple[Path, ...] = ()) -> DictConfig:
    """A document and the bases it names under ``defaults``, merged base-first (unresolved)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: circular 'defaults' chain")
    raw = _load_file(path)
    bases = raw.pop("defaults", None) or []
    if isinstance(bases, str) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: 'defaults' must be a list of sibling file names, e.g. [_base]")
    merged = OmegaConf.create({})
    for base in bases:
        base_path = path.parent / (base if str(base).endswith(".yaml") else f"{base}.yaml")
        merged = OmegaConf.merge(merged, load_recipe(base_path, _seen + (path.resolve(),)))
    return OmegaConf.merge(merged, raw)


def load_yaml_recipe(path: str | Path) -> dict:
    """A recipe with its ``defaults`` merged and interpolation resolved, as a plain dict."""
    return _resolve(load_recipe(path), str(path))


def _split_override(item: str) -> tuple[str, str, str]:
    """``[+|++|~]key=value`` -> (prefix, key, value). Hydra's prefixes: ``+`` add, ``++`` add or replace,
    ``~`` delete; merging here never refuses a new or existing key, so ``+``/``++`` behave alike."""
    key, sep, value = item.partition("=")
    prefix = "~" if key.startswith("~") else "+" if key.startswith("+") else ""
    key = key.lstrip("~+").strip()
    if prefix != "~" and not sep:
        raise ValueError
    if not key or any(not part for part in key.split(".")):
        raise ValueError
    return prefix, key, value


def parse_overrides(overrides: list[str]) -> dict:
    """``a.b.c=value`` into a nested dict; the value is parsed as OmegaConf parses a dotlist value (YAML:
    numbers, booleans, ``null``, lists ``[1.0,/path]``, ``${...}`` kept for later resolution)."""
    cfg, _, _ = _override_config(overrides)
    return OmegaConf.to_container(cfg, resolve=False)


def _override_config(overrides: list[str]) -> tuple[DictConfig, set[str], list[str]]:
    """The command line as one OmegaConf document, the keys it sets, and the keys it deletes (``~key``)."""
    problems, keys, deletes = [], set(), []
    cfg = OmegaConf.create({})
    for item in overrides:
        try:
            prefix, key, value = _split_override(item)
        except ValueError:
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        if prefix == "~":
            deletes.append(key)
            continue
        for other in keys:  # a.b=1 then a.b.c=2 (or the reverse) cannot both hold
            if other.startswith(key + ".") or key.startswith(other + "."):
                problems.append(f"override {item!r} conflicts with an earlier override of {other!r}")
                break
        else:
            try:
                cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
            except (OmegaConfBaseException, yaml.YAMLError) as exc:
                problems.append(f"override {item!r}: {str(exc).splitlines()[0]}")
                continue
            keys.add(key)
    if problems:
        raise ConfigError(problems, "command line")
    return cfg, keys, deletes


def _resolve(cfg: DictConfig, source: str) -> dict:
    """Resolve ``${...}``; ``???`` (mandatory) stays as the string for ``nemo_compat`` to report by key."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        msg = str(exc).splitlines()[0]
        raise ConfigError(f"{key}: {msg}" if key else msg, source) from None


def load_document(path: str | Path | None, overrides: list[str], task: str,
                  world_size: int | None = None) -> dict:
    """File (with ``defaults``) + command line -> resolved dict in our key names. NeMo keys that have no
    effect here are logged once, in one warning, each with its reason; bad NeMo values raise ConfigError."""
    source = str(path) if path else "command line"
    cfg = load_recipe(path) if path else OmegaConf.create({})
    cli, cli_keys, deletes = _override_config(list(overrides))
    cfg = OmegaConf.merge(cfg, cli)
    for key in deletes:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            raise ConfigError(f"override '~{key}': no such key to delete", "command line")
        del node[leaf]  # (pop would resolve the value it returns)
    doc = _resolve(cfg, source)
    out, problems, ignored = nemo_compat.translate(doc, task, cli_keys, world_size)
    if problems:
        raise ConfigError(problems, source)
    if ignored:
        by_reason: dict[str, list[str]] = {}
        for key, reason in ignored.items():
            by_reason.setdefault(reason, []).append(key)
        lines = [f"  - {', '.join(keys)}: {reason}" for reason, keys in by_reason.items()]
        log.warning("%s: %d NeMo key(s) have no effect here:\n%s", source, len(ignored), "\n".join(lines))
    return out


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    """Check/coerce ``value`` against a type annotation; returns (ok, coerced)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            if arm is type(None) and value is None:
                return True, None
        for arm in typing.get_args(tp):
            if arm is not type(None):
                ok, v = _type_ok(value, arm)
                if ok:
                    return True, v
        return False, value
    if origin is typing.Literal:
        return (value in typing.get_args(tp)), value
    if origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            args = typing.get_args(tp)
            if args and args[0] is not Ellipsis:
                coerced = []
                for v in value:
                    ok, c = _type_ok(v, args[0])
                    if not ok:
                        return False, value
                    coerced.append(c)
                value = coerced
            return True, list(value)
        return False, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return (isinstance(value, int) and not isinstance(value, bool)), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        if isinstance(value, str):  # YAML reads "1e-12" without a dot as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if tp is str:
        return isinstance(value, (str, int, float)) and not isinstance(value, bool), str(value)
    return True, value


def from_dict(cls: type[T], data: dict, path: str = "", problems: list[str] | None = None) -> T:
    """Build dataclass ``cls`` from ``data``; every unknown key / bad type is appended to ``problems``."""
    own = problems is None
    problems = [] if own else problems
    if not isinstance(data, dict):
        problems.append(f"{path or '<root>'}: expected a mapping, got {data!r}")
        data = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            close = [n for n in names if n.lower().startswith(str(key)[:4].lower())]
            hint = f" (did you mean {', '.join(sorted(close))}?)" if close else ""
            problems.append(f"unknown key '{path}{key}'{hint}; known keys under '{path or '<root>'}': "
                            f"{', '.join(sorted(names))}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, tp = data[f.name], hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = from_dict(tp, value, f"{path}{f.name}.", problems)
            continue
        ok, coerced = _type_ok(value, tp)
        if not ok:
            problems.append(f"'{path}{f.name}' = {value!r}: expected {_type_name(tp)}")
            continue
        kwargs[f.name] = coerced
    try:
        obj = cls(**kwargs)
    except ConfigError as exc:
        problems.extend(exc.problems)
        obj = None
    if own and problems:
        raise ConfigError(problems)
    return obj  # type: ignore[return-value]


def build_config(cls: type[T], raw: dict, validate: Callable[[T], None], source: str | None = None,
                 prepare: Callable[[T], None] | None = None) -> T:
    """``from_dict`` then ``validate`` on what parsed, so that unknown keys, bad types and impossible
    layouts are all reported in one ConfigError. ``prepare`` derives fields before validation."""
    problems: list[str] = []
    cfg = from_dict(cls, raw, problems=problems)
    if prepare is not None:
        prepare(cfg)
    try:
        validate(cfg)
    except ConfigError as exc:
        problems.extend(p for p in exc.problems if p not in problems)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _type_name(tp: Any) -> str:
    """A type as the user reads it: a Literal lists its allowed values, a Union its arms."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj
