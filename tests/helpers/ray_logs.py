"""What a Ray session's own logs say, for a test whose run did not get where it waited for.

A run that waits for workers that never come says nothing on its driver's output; the reason
(a worker killed while it started, one that never registered, a refused token, a failed runtime
env) is in the session's log folder. A test that times out appends this to its message, so that
a failure seen only on another machine (CI) carries its cause.
"""

from __future__ import annotations

import glob
import json
import os
import re

# Lines of Ray's logs that say why a worker did not come (or went): warnings and errors of its
# C++ processes ("[date time W pid tid]"), of its Python ones, and the words of a worker's end.
TELLING = re.compile(
    r"^\[\S+ \S+ [WEF] \d|\b(?:ERROR|WARNING|CRITICAL|Traceback)\b"
    r"|not registered|unexpectedly|killed|refused|auth"
)
# The raylet's periodic state dumps ("objects errored: 0", "plasma error: 0") say nothing; nor does a
# client that went away ("Disconnecting client ... End of file").
NOISE = re.compile(r"\[state-dump\]|^- |errored: 0|error: 0|Disconnecting client due to connection error")


def session_dirs_of_drivers(state_dir: str) -> list[str]:
    """The session folders the embedded clusters of drivers recorded in `state_dir` use."""
    found = []
    for record in glob.glob(os.path.join(state_dir, "driver-*.json")):
        try:
            with open(record) as f:
                session = json.load(f).get("session_dir") or ""
        except (OSError, ValueError):
            continue
        if session:
            found.append(session)
    return found


def story(session_dir: str, per_file: int = 12, files: int = 12) -> str:
    """The telling lines of the session's Ray logs: the last `per_file` of each of its `files`
    most telling log files, newest lines last. Empty where the folder is gone."""
    logs = os.path.join(os.path.realpath(session_dir), "logs")
    if not os.path.isdir(logs):
        return ""
    picked = []
    for path in sorted(glob.glob(os.path.join(logs, "*"))):
        if not os.path.isfile(path) or not path.endswith((".out", ".err", ".log")):
            continue
        try:
            with open(path, errors="replace") as f:
                telling = [line.rstrip()[:400] for line in f if TELLING.search(line) and not NOISE.search(line)]
        except OSError:
            continue
        if telling:
            picked.append((len(telling), path, telling[-per_file:]))
    # raylet.out and gcs_server.out first (why a worker was started, killed or refused), then the
    # files with the most telling lines.
    picked.sort(key=lambda entry: (not os.path.basename(entry[1]).startswith(("raylet", "gcs_server")), -entry[0]))
    parts = [f"--- {os.path.basename(path)} ({count} telling line(s), the last {len(lines)}):\n" + "\n".join(lines)
             for count, path, lines in picked[:files]]
    workers = len(glob.glob(os.path.join(logs, "worker-*.out")))
    return f"Ray session {session_dir} ({workers} worker log(s)):\n" + "\n".join(parts)


def stories(session_dirs: list[str]) -> str:
    return "\n".join(story(s) for s in session_dirs) or "(no Ray session folder found)"
