"""Every use of Ray's private API, in one place, checked against the Ray versions it was read in.

Ray offers no public way to do these four things; each is wrapped here, and each raises a clear
error on a Ray version outside CHECKED_RAY (pyproject.toml pins the same range), instead of
failing somewhere inside Ray. `tests/unit/test_ray_private.py` fails on any private name of Ray,
Lightning or torch used outside this module.

- Token authentication switched on after Ray was imported: Ray reads RAY_AUTH_MODE and caches
  the token at import; joining the warm cluster, or giving an embedded cluster a token of its
  own, from a process that imported Ray first needs both refreshed (and restored after), as Ray
  itself does when it turns token auth on for a local cluster.
- The worker-local preemption notice of Ray Train V2: the public `ray.train.get_preemption_info()`
  is a barrier through an actor, too slow to call at every step.
- The logger name of Ray's token-auth notice, to keep it off an embedded cluster's console.
- A trainer without Ray Train's datasets callback, whose Ray Data actor every group start would
  otherwise start and never use.
"""

from __future__ import annotations

import functools
import os

from orchestrator.errors import UserError

# The Ray versions whose sources these uses were read in.
CHECKED_RAY = ((2, 60), (2, 61))
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class UnsupportedRay(UserError):
    """Ray's version is outside CHECKED_RAY; the message names it and the versions to install."""


def restore_environ(saved: dict[str, str | None]) -> None:
    """Put environment variables back as they were (None: it was not set)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@functools.cache  # once per process: the notice is read at every step
def _check_version() -> None:
    import ray

    major_minor = tuple(int(part) for part in ray.__version__.split(".")[:2])
    low, high = CHECKED_RAY
    if not low <= major_minor < high:
        raise UnsupportedRay(
            f"Ray {ray.__version__} is installed, but the orchestrator uses parts of Ray's private API read in Ray "
            f"{low[0]}.{low[1]}.x only (orchestrator/ray_private.py). Fix: pip install 'ray[default,train]>="
            f"{low[0]}.{low[1]},<{high[0]}.{high[1]}'.")


AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def enable_token_auth(token: str) -> dict[str, str | None]:
    """Authenticate to a cluster with `token` from now on (this process and what it starts).
    Returns the variables' values before, for `restore_token_auth`."""
    _check_version()
    saved = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    from ray._private.authentication.authentication_token_setup import _enable_token_auth
    from ray._raylet import AuthenticationTokenLoader

    _enable_token_auth()
    AuthenticationTokenLoader.instance().reset_cache()
    return saved


def restore_token_auth(saved: dict[str, str | None]) -> None:
    """Undo `enable_token_auth`: the variables as they were, and Ray's cached mode and token
    read again from them (a later ray.init in this process finds the user's own settings)."""
    _check_version()
    restore_environ(saved)
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def preemption_notice():
    """Ray Train's worker-local notice that a node of this worker group is about to be
    preempted (None: no notice, or not inside a Ray Train worker)."""
    _check_version()
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().preemption_context.preemption_info
    except (ImportError, AttributeError, RuntimeError):
        return None


def without_dataset_actors(trainer_class: type) -> type:
    """`trainer_class` whose worker-group starts start no Ray Data DatasetManager actor: Ray
    Train's default DatasetsCallback starts one at every group start even when the trainer was
    given no datasets, as ours never is (the ranks read their data themselves)."""
    _check_version()
    from ray.train.v2._internal.callbacks import DatasetsCallback

    class Trainer(trainer_class):
        def _create_default_callbacks(self):
            return [callback for callback in super()._create_default_callbacks()
                    if not isinstance(callback, DatasetsCallback)]

    Trainer.__name__ = Trainer.__qualname__ = trainer_class.__name__
    return Trainer
