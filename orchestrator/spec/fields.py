"""Typed readers of spec fields, each raising one SpecError paragraph naming the field path, the
value given and the fix; `read`, which reads a field as its declaration says (its type, default,
bounds and choices: facts.py); and `import_object`, the one way a spec's dotted name is imported."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import SpecError, nearest
from orchestrator.spec.facts import default_of, facts_of, field_of

_SAME = object()


def read(raw: Mapping[str, Any], cls: type, name: str, path: str, default: Any = _SAME) -> Any:
    """Field `name` of section `cls` from `raw`, checked as its declaration says: a required one
    (no default) must be given; a number is checked against its bounds, a choice against its
    choices. `default` replaces the declared one where it depends on other fields."""
    facts = facts_of(field_of(cls, name))
    default = default_of(cls, name) if default is _SAME else default
    kind = _kind(cls, name)
    if default is dataclasses.MISSING:
        return require(raw, name, path, kind, example=facts.example)
    if facts.choices:
        return choice(raw, name, path, facts.choices, default)
    if kind is bool:
        return boolean(raw, name, path, default)
    if kind in (int, float) and facts.above is None:
        assert facts.minimum is not None, f"{cls.__name__}.{name} declares no bound"
    if kind is int:
        return integer(raw, name, path, default, minimum=int(facts.minimum))
    # The spec's floats are durations (a least number of seconds) and ratios (above a bound);
    # each reader says the unit in its message.
    if kind is float and facts.above is not None:
        return ratio(raw, name, path, default, above=facts.above)
    if kind is float:
        return seconds(raw, name, path, default, minimum=facts.minimum)
    return optional(raw, name, path, kind, default)


@functools.cache
def _kind(cls: type, name: str) -> type:
    """The field's type, without None: str, int, float, bool, dict or list."""
    hint = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))[name]
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.get_origin(hint) or hint


def check_keys(raw: Mapping[str, Any], cls: type, path: str, extra: tuple[str, ...] = ()) -> None:
    valid = [f.name for f in dataclasses.fields(cls)] + list(extra)
    for key in raw:
        if key not in valid:
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(
                f"field '{where}' is not a valid key{nearest(str(key), valid)}. "
                f"Valid keys{' under ' + path if path else ''}: {', '.join(valid)}."
            )


def mapping(raw: Any, path: str) -> None:
    if not isinstance(raw, Mapping):
        raise SpecError(f"field '{path}': got {describe(raw)}, expected a mapping of fields. "
                        f"Fix: write '{path}:' followed by indented 'key: value' lines.")


def require(raw: Mapping[str, Any], key: str, path: str, kind: type, example: str | None = None) -> Any:
    where = f"{path}.{key}" if path else key
    if raw.get(key) is None:
        hint = f", e.g. {key}: {example}" if example else ""
        raise SpecError(f"field '{where}' is required but missing. Fix: add it to the spec{hint}.")
    return typed(raw[key], where, kind)


def optional(raw: Mapping[str, Any], key: str, path: str, kind: Any, default: Any) -> Any:
    if raw.get(key) is None:
        return default
    return typed(raw[key], f"{path}.{key}" if path else key, kind)


def typed(value: Any, where: str, kind: Any) -> Any:
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        expected = {"dict": "a mapping", "str": "a string", "list": "a list"}.get(names, names)
        raise SpecError(f"field '{where}': got {describe(value)}, expected {expected}. "
                        f"Fix: give '{where}' {expected}.")
    return value


def integer(raw: Mapping[str, Any], key: str, path: str, default: int | None, minimum: int) -> int | None:
    where = f"{path}.{key}" if path else key
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"field '{where}': got {describe(value)}, expected a whole number >= {minimum}. "
                        f"Fix: e.g. {key}: {max(minimum, 1) if default is None else default}.")
    if value < minimum:
        raise SpecError(f"field '{where}': got {value}, but it must be at least {minimum}. "
                        f"Fix: set {where} to {minimum} or more.")
    return value


def seconds(raw: Mapping[str, Any], key: str, path: str, default: float, minimum: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise SpecError(f"field '{path}.{key}': got {describe(value)}; it must be a number of seconds of at "
                        f"least {minimum:g}. Fix: e.g. {key}: {default:g}.")
    return float(value)


def ratio(raw: Mapping[str, Any], key: str, path: str, default: float, above: float = 1.0) -> float:
    """A ratio above `above` (how many times a value may exceed another's)."""
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= above:
        raise SpecError(f"field '{path}.{key}': got {describe(value)}; it must be a ratio above {above:g}. "
                        f"Fix: e.g. {key}: {default:g}.")
    return float(value)


def boolean(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"field '{path}.{key}': got {describe(value)}, expected true or false. "
                        f"Fix: write {key}: {str(default).lower()}.")
    return value


def choice(raw: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise SpecError(
            f"field '{path}.{key}': {value!r} is not a valid choice{nearest(str(value), choices)}. "
            f"Valid choices: {', '.join(choices)}. Fix: set {key}: {default}."
        )
    return value


def describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def check_import_path(dotted: str, field_path: str) -> tuple[str, str]:
    """"pkg.mod.Name" or "pkg.mod:Name" -> (module, attribute), without importing anything."""
    if ":" in dotted:
        module_name, _, attr = dotted.partition(":")
    else:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise SpecError(
            f"field '{field_path}': {dotted!r} is not an import path. Fix: write 'package.module.Name' "
            "or 'package.module:name', e.g. jobs.digits.DigitsClassifier."
        )
    return module_name, attr


def import_object(dotted: str, field_path: str) -> Any:
    """Import "pkg.mod.Name" or "pkg.mod:Name"; a failure names the module and attribute tried."""
    module_name, attr = check_import_path(dotted, field_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise SpecError(
                f"field '{field_path}': module '{module_name}' (for {dotted!r}) could not be imported: "
                f"no module named '{exc.name}'. Fix: check the spelling, run from the directory that "
                "contains the package, or install it (pip install -e .)."
            ) from None
        raise SpecError(
            f"field '{field_path}': module '{module_name}' was found but importing it failed: {exc}. "
            f"Fix: install the missing dependency '{exc.name}'."
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise SpecError(
            f"field '{field_path}': importing module '{module_name}' raised {type(exc).__name__}: {exc}. "
            "Fix: make the module importable (run `python -c \"import "
            f"{module_name}\"` to see the full error)."
        ) from None
    if not hasattr(module, attr):
        public = [n for n in dir(module) if not n.startswith("_")]
        raise SpecError(
            f"field '{field_path}': module '{module_name}' has no attribute '{attr}'"
            f"{nearest(attr, public)}. Fix: correct the name after the last '.' in {dotted!r}."
        )
    return getattr(module, attr)


# --- small checkers: each raises SpecError with path, value and fix -----------------------------
