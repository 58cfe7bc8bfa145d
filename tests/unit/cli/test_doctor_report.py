"""doctor's verdict: a warning passes unless --strict asks it to fail (cli/doctor_report.py)."""

from __future__ import annotations

from orchestrator.cli.doctor_report import Check, Report

CHECKS = [Check("versions", True, "same everywhere"), Check("matmul", True, "node x is slow", warning=True)]


def test_a_warning_passes_and_says_that_strict_would_fail_it():
    report = Report(["table"], CHECKS)
    assert report.ok
    assert report.text() == ("table\n\nPASS  versions: same everywhere\nWARN  matmul: node x is slow\n"
                             "doctor: all 2 checks passed, 1 with a warning (--strict fails on a warning)")


def test_strict_fails_on_a_warning_and_says_so():
    report = Report(["table", "nodes"], CHECKS, strict=True)
    assert not report.ok
    assert report.text().endswith("doctor: all 2 checks passed, 1 with a warning (failed by --strict)")
    assert report.text().startswith("table\n\nnodes\n\n")


def test_a_failure_fails_with_or_without_strict():
    failed = [*CHECKS, Check("storage", False, "not shared")]
    assert not Report([""], failed).ok and not Report([""], failed, strict=True).ok
    assert "doctor: 1 of 3 checks failed, 1 with a warning" in Report([""], failed).text()
