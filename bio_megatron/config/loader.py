"""Typed configs from NeMo-style YAML recipes with ``key=value`` overrides.

A recipe is a thin YAML delta on a base (``defaults: [_base]`` names sibling files merged first).
Dataclasses mirror the YAML; unknown keys and wrong types are collected and reported together,
quoting the key path and the value.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from bio_megatron.utils.errors import ConfigError

T = TypeVar("T")


def deep_merge(base: dict, delta: dict) -> dict:
    out = dict(base)
    for k, v in delta.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml_recipe(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a recipe and the bases it names under ``defaults``, merged base-first."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: circular 'defaults' chain")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    merged: dict = {}
    for base in raw.pop("defaults", None) or []:
        base_path = path.parent / (base if str(base).endswith(".yaml") else f"{base}.yaml")
        merged = deep_merge(merged, load_yaml_recipe(base_path, _seen + (path.resolve(),)))
    return deep_merge(merged, raw)


def parse_overrides(overrides: list[str]) -> dict:
    """``a.b.c=value`` (value parsed as YAML: numbers, booleans, lists ``[1.0,/path]``, null) into a nested dict."""
    out: dict = {}
    problems = []
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("+")
        if not sep or not key:
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                problems.append(f"override {item!r} conflicts with an earlier override of {part!r}")
                break
        else:
            node[parts[-1]] = parsed
    if problems:
        raise ConfigError(problems, "command line")
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
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj
