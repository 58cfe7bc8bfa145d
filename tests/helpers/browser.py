"""A real headless Chromium (the system's package: Debian's `chromium`) for the pages the
orchestrator writes: the DOM after the page's scripts ran, and a screenshot to look at."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """The browser's path; skips the test where this machine has none."""
    found = next((path for path in map(shutil.which, NAMES) if path), None)
    if found is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def _run(page: str, *flags: str, timeout: float = 90) -> subprocess.CompletedProcess:
    # A profile of its own (removed after), no sandbox (root in a container), no GPU.
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--user-data-dir={profile}", "--virtual-time-budget=5000", *flags,
                               "file://" + os.path.abspath(page)],
                              capture_output=True, text=True, timeout=timeout)


def rendered_dom(page: str) -> str:
    """The page's DOM once its scripts ran."""
    done = _run(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(page: str, png: str, width: int = 1300, height: int = 1500) -> None:
    done = _run(page, f"--screenshot={png}", f"--window-size={width},{height}")
    assert done.returncode == 0 and os.path.getsize(png) > 10_000, done.stderr[-2000:]
