"""What a rank child and its agent agree on lives in one module (rank/agent_contract.py), which the
bootstrap of a user's torchrun script loads by its path: standard library only, so that the script
starts with nothing of the package, nor torch or Ray, imported; and the bootstrap's view of it is
the agent's."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from orchestrator.agent.children import BOOTSTRAP
from orchestrator.rank import agent_contract
from orchestrator.rank.script import bootstrap


def _top_level_imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    return {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names} | {
        node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}


def test_the_contract_and_the_bootstrap_import_nothing_but_the_standard_library():
    for path in (agent_contract.__file__, BOOTSTRAP):
        outside = {name for name in _top_level_imports(path) if name not in sys.stdlib_module_names}
        assert not outside, (path, outside)


def test_a_script_under_the_bootstrap_starts_with_nothing_of_the_package_torch_or_ray_imported(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
                      "('orchestrator', 'torch', 'ray', 'lightning')))\n")
    done = subprocess.run([sys.executable, BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, agent_contract.BEAT_FILE_VAR: str(tmp_path / "beat")})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    # The beat file it wrote has the contract's layout.
    assert len((tmp_path / "beat").read_bytes()) == agent_contract.BEAT_LAYOUT.size


def test_the_beat_files_parts_line_up_with_its_layout():
    c = agent_contract
    assert (c.STEP_LAYOUT.size, c.STACK_OFFSET + c.SECONDS.size, c.WORK_OFFSET + c.SECONDS.size) == (
        c.STACK_OFFSET, c.WORK_OFFSET, c.BEAT_LAYOUT.size)
    fields = c.BEAT_LAYOUT.unpack(c.STEP_LAYOUT.pack(7, 1.5, 0.25) + c.SECONDS.pack(2.5) + c.SECONDS.pack(0.125))
    assert fields == (7, 1.5, 0.25, 2.5, 0.125)


def test_the_bootstraps_names_are_the_contracts():
    assert bootstrap.BEAT_LAYOUT.format == agent_contract.BEAT_LAYOUT.format
    assert (bootstrap.STACK_OFFSET, bootstrap.WORK_OFFSET) == (agent_contract.STACK_OFFSET, agent_contract.WORK_OFFSET)
    assert (bootstrap.BEAT_FILE_VAR, bootstrap.FAILURE_FILE_VAR, bootstrap.FAILING_SUFFIX, bootstrap.FR_SIGNAL_VAR,
            bootstrap.FR_FILE_VAR) == (agent_contract.BEAT_FILE_VAR, agent_contract.FAILURE_FILE_VAR,
                                       agent_contract.FAILING_SUFFIX, agent_contract.FR_SIGNAL_VAR,
                                       agent_contract.FR_FILE_VAR)
