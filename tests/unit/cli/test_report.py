"""`orchestrator report` without its optional extra, and with nothing to report: a clear error,
exit 2, no traceback (cli/report.py)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, run_cli

WITHOUT_PLOTLY = ("import runpy, sys; sys.modules['plotly'] = None; sys.argv = ['orchestrator', 'report', sys.argv[1]]; "
                  "runpy.run_module('orchestrator', run_name='__main__')")


def test_without_plotly_it_names_the_extra_to_install(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    done = subprocess.run([sys.executable, "-c", WITHOUT_PLOTLY, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert "draws with plotly, which is not installed here" in done.stderr
    assert "pip install 'orchestrator[report]'" in done.stderr and "Traceback" not in done.stderr


def test_a_folder_without_a_run_says_what_it_looked_for(tmp_path):
    done = run_cli("report", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{tmp_path} holds no run to report: neither history/ nor summary.json is there" in done.stderr
