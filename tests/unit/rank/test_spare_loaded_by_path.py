"""rank/spare.py as a rank's bootstrap loads it, by its path with nothing of the package imported:
it reads /proc through orchestrator/procfs.py, loaded by path too."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.rank.script.bootstrap import __file__ as BOOTSTRAP

CODE = f"""
import sys
sys.path[:] = [p for p in sys.path if "wt-" not in p and p not in ("", ".")]
sys.argv = [{BOOTSTRAP!r}]
import importlib.util
found = importlib.util.spec_from_file_location("boot", {BOOTSTRAP!r})
boot = importlib.util.module_from_spec(found)
found.loader.exec_module(boot)
spare = boot._load_beside("spare.py")
assert "orchestrator" not in sys.modules, sorted(m for m in sys.modules if m.startswith("orchestrator"))
assert spare.session_niceness() is None or isinstance(spare.session_niceness(), int)
assert isinstance(spare.may_lower_to(0), bool)
print("ok")
"""


def test_a_spare_loaded_by_path_imports_nothing_of_the_package():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, env={})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
