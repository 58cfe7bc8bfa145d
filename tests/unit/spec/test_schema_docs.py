"""docs/spec.md's field list ("Every field") agrees with the fields, through the JSON Schema generated
from them: every documented key is a field, every field is documented, a documented value is the
field's default unless its comment begins with "e.g.", and a documented bound or set of choices is
the field's own."""

from __future__ import annotations

import functools
import os
import re

import pytest
import yaml
from conftest import REPO

from orchestrator.spec.schema import job_spec_schema

BOUND = re.compile(r"\((>=|>) (-?[\d.]+)\)")


@functools.cache
def schema() -> dict:
    return job_spec_schema()


@functools.cache
def field_list() -> tuple[yaml.Node, tuple[str, ...]]:
    """The YAML block under "## Every field": its node tree and its lines."""
    with open(os.path.join(REPO, "docs", "spec.md"), encoding="utf-8") as f:
        text = f.read().split("## Every field", 1)[1]
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.compose(block, Loader=yaml.SafeLoader), tuple(block.splitlines())


def comment(line: int) -> str:
    text = field_list()[1][line]
    return text.split(" #", 1)[1].strip() if " #" in text else ""


def label(path: str) -> str:
    """One name for one section: data.train, data.val and data.test share the source's fields."""
    return re.sub(r"^data\.(train|val|test)\b", "data.<source>", path)


def resolve(prop: dict, path: str, kind: type = yaml.MappingNode) -> tuple[dict, str]:
    """The schema a documented value of `kind` meets (the option of an anyOf), and its section's name."""
    options = prop.get("anyOf", [prop])
    want = "array" if kind is yaml.SequenceNode else "object"
    for option in options:
        if "$ref" in option:
            name = option["$ref"].rsplit("/", 1)[1]
            if want == "object":
                return schema()["$defs"][name], f"$defs.{name}"
        elif option.get("type") == want:
            return option, label(path)
    return prop, label(path)


@functools.cache
def walk_docs() -> tuple[frozenset, tuple]:
    """(section, key) pairs documented, and each documented key's (path, node, schema, whether it
    sits in a flow mapping, line)."""
    documented, keys = set(), []

    def visit(node: yaml.Node, sch: dict, section: str, path: str, flow: bool) -> None:
        flow = flow or getattr(node, "flow_style", False)
        if isinstance(node, yaml.SequenceNode):
            items, _ = resolve(sch, path, yaml.SequenceNode)
            for item in node.value:
                visit(item, *resolve(items.get("items", {}), path, type(item)), path, flow)
            return
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value in node.value:
            key, where = key_node.value, f"{path}.{key_node.value}".lstrip(".")
            props = sch.get("properties", {})
            if key in props:
                documented.add((section, key))
                prop = props[key]
                keys.append((where, value, prop, flow, key_node.start_mark.line))
            elif sch.get("additionalProperties") is False:
                keys.append((where, value, None, flow, key_node.start_mark.line))
                continue
            else:
                prop = sch.get("additionalProperties") or {}  # a free-form mapping: its values' schema
            visit(value, *resolve(prop, where, type(value)), where, flow)

    visit(field_list()[0], schema(), "", "", False)
    return frozenset(documented), tuple(keys)


def fields() -> list[tuple[str, str]]:
    """Every (section, key) a spec may write, from the schema."""
    found, seen = [], set()

    def visit(sch: dict, section: str, path: str) -> None:
        if section in seen:
            return
        seen.add(section)
        for key, prop in sch.get("properties", {}).items():
            found.append((section, key))
            where = f"{path}.{key}".lstrip(".")
            for option in prop.get("anyOf", [prop]):
                for item in (option, option.get("items", {}), option.get("additionalProperties") or {}):
                    for inner in item.get("anyOf", [item]):
                        if "$ref" in inner or inner.get("properties"):
                            visit(*resolve(inner, where), where)

    visit(schema(), "", "")
    return found


def test_every_documented_key_is_a_field_of_the_spec():
    unknown = [where for where, _, prop, _, _ in walk_docs()[1] if prop is None]
    assert not unknown, f"docs/spec.md documents keys that are no field: {unknown}"


def test_every_field_of_the_spec_is_documented():
    documented = walk_docs()[0]
    missing = [f"{section}.{key}".lstrip(".") for section, key in fields() if (section, key) not in documented]
    assert not missing, f"docs/spec.md's field list leaves out: {missing}"


def test_a_documented_value_is_the_fields_default_unless_its_comment_says_it_is_an_example():
    wrong = []
    for where, node, prop, flow, line in walk_docs()[1]:
        if prop is None or flow or not isinstance(node, yaml.ScalarNode) or comment(line).startswith("e.g."):
            continue
        value = yaml.SafeLoader("").construct_object(node)
        if "default" in prop and value != prop["default"]:
            wrong.append(f"{where}: documented {value!r}, the default is {prop['default']!r}")
        elif "default" not in prop and not re.match(r"required\b|.*\bdefault\b", comment(line)):
            wrong.append(f"{where}: documented {value!r}, but it has no default of its own: its comment "
                         "begins with 'e.g.' or 'required', or says what the default is")
    assert not wrong, "docs/spec.md: " + "; ".join(wrong)


@pytest.mark.parametrize("what", ["bound", "choices"])
def test_a_documented_bound_or_choice_is_the_fields_own(what):
    wrong = []
    for where, _, prop, flow, line in walk_docs()[1]:
        if prop is None or flow:
            continue
        options = [prop, *prop.get("anyOf", [])]
        if what == "bound":
            stated = BOUND.search(comment(line))
            keyword = {">=": "minimum", ">": "exclusiveMinimum"}[stated.group(1)] if stated else None
            bounds = [o[keyword] for o in options if keyword in o] if stated else []
            if stated and float(stated.group(2)) not in bounds:
                wrong.append(f"{where}: documented {stated.group(0)}, the field's bounds are {bounds or 'other'}")
        else:
            choices = [c for o in options for c in o.get("enum", [])]
            left_out = [c for c in choices if not re.search(rf"\b{re.escape(str(c))}\b", comment(line))]
            if left_out:
                wrong.append(f"{where}: its comment leaves out the choices {left_out}")
    assert not wrong, "docs/spec.md: " + "; ".join(wrong)
