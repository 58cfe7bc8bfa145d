"""The package uses only public APIs of Ray, Lightning and torch, but for the private uses wrapped
in orchestrator/ray_private.py (each checked against the Ray versions it was read in). A new
private name anywhere fails this test, naming where it is."""

from __future__ import annotations

import ast
import os

from conftest import REPO

LIBRARIES = ("ray", "torch", "lightning", "pytorch_lightning", "deepspeed")
# Where a private name may be used, and which: what Ray offers no public way to do.
ALLOWED = {
    "orchestrator/ray_private.py": {
        "ray._private.authentication.authentication_token_setup._enable_token_auth",
        "ray._raylet.AuthenticationTokenLoader",
        "ray._raylet.Config",
        "ray.train.v2._internal.callbacks.DatasetsCallback",
        "ray.train.v2._internal.execution.context.get_train_context",
    },
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _is_private(dotted: str) -> bool:
    """A name with a segment of one leading underscore (dunders such as __version__ are public)."""
    parts = dotted.split(".")
    return parts[0] in LIBRARIES and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def private_names(path: str) -> set[str]:
    """The private names of the libraries a module imports or reaches through their modules."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _is_private(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names if _is_private(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted and _is_private(dotted):
                found.add(dotted)
    # An attribute chain is seen at every depth (ray._private, ray._private.worker, ...): keep the longest.
    return {n for n in found if not any(other.startswith(n + ".") for other in found)}


def test_private_names_of_ray_lightning_and_torch_are_used_only_where_they_are_wrapped():
    used = {}
    for folder, _, files in os.walk(os.path.join(REPO, "orchestrator")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                names = private_names(path)
                if names:
                    used[os.path.relpath(path, REPO)] = names
    assert used == ALLOWED
