"""One home for each spec field's facts: `option(...)` declares a dataclass field of the spec with its
default, its bounds, its choices and its YAML key, and the comment written above the field is its
documentation. Validation (fields.py `read`), the JSON Schema (schema.py), overrides (load.py) and
the check of docs/spec.md read them from the field; none writes a default, a bound or an alias again.

    @dataclass(frozen=True)
    class KeepBestSpec:
        # Keep the K checkpoints with the best value of `monitor`.
        k: int = option(1, minimum=1)

A field without a default is required. Imports nothing of the project: every spec module may use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

META = "orchestrator.spec"


@dataclass(frozen=True)
class Facts:
    """What a spec field allows, beyond its type and its default."""

    # The least value allowed (inclusive), for numbers.
    minimum: float | None = None
    # Values must be greater than this (exclusive), for numbers.
    above: float | None = None
    # The values allowed, for a string picked from a list.
    choices: tuple[str, ...] = ()
    # The key a spec writes for it, where it differs from the field's name (checkpoint.async).
    key: str | None = None
    # What a missing required field's fix shows, e.g. "digits-ddp".
    example: str | None = None
    # The field is not written under its own key: the words say where it comes from instead.
    derived: str | None = None
    # The default depends on other fields: the words say how (the declared default is one case).
    depends: str | None = None


NO_FACTS = Facts()


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, kw_only: bool = False,
           **facts: Any) -> Any:
    """A spec field: its default (or a factory for a mutable one) and its Facts. `kw_only` lets a
    required field follow one with a default and keep its place among the section's keys."""
    metadata = {META: Facts(**facts)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, kw_only=kw_only, metadata=metadata)
    return dataclasses.field(default=default, kw_only=kw_only, metadata=metadata)


def facts_of(f: dataclasses.Field) -> Facts:
    return f.metadata.get(META, NO_FACTS)


def field_of(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def default_of(cls: type, name: str) -> Any:
    """The field's default (a fresh value from its factory), or dataclasses.MISSING: required."""
    f = field_of(cls, name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def key_of(f: dataclasses.Field) -> str:
    """The key a spec writes for the field."""
    return facts_of(f).key or f.name


def aliases(cls: type) -> dict[str, str]:
    """Spec key -> field name, for the fields whose key differs from their name."""
    return {key_of(f): f.name for f in dataclasses.fields(cls) if key_of(f) != f.name}


def to_keys(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """A section's values by field name (JobSpec.to_dict) -> by the keys a spec writes."""
    keys = {f.name: key_of(f) for f in dataclasses.fields(cls)}
    return {keys.get(name, name): value for name, value in values.items()}
