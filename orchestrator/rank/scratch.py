"""Scratch folders a worker keeps in the machine's temporary directory while it runs.

Each is named `<prefix><pid>-<random>` after the process that made it, which removes it when it
ends. A process that was killed (a lost node, Ray's teardown, SIGKILL) cannot: the next one with
the same prefix on the machine removes the folders whose process is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from orchestrator.processes import is_alive


def make_scratch(prefix: str) -> str:
    """A new scratch folder of this process, after removing those of dead processes."""
    remove_dead_scratch(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def remove_dead_scratch(prefix: str) -> None:
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not is_alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
