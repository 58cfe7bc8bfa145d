"""A torchrun script that says what its rank's environment holds (tests/e2e/test_torchrun_promises.py):

    python tests/helpers/torchrun_env_seen.py --out DIR [--show NAME ...]

Each rank writes DIR/rank-<RANK>.json: the names of the RAY_* variables it sees, the value of
each variable named by --show (null where unset), and what its parent process (the agent that
started it; on Ray a Ray Train worker) has, read from /proc: its command line and the names of
its RAY_* variables, so that a test knows there was something to leak. It imports nothing but
the standard library and exits 0 at once.
"""

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--show", action="append", default=[])
    args = parser.parse_args()
    parent = os.getppid()
    with open(f"/proc/{parent}/environ", "rb") as f:
        parent_names = [item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if b"=" in item]
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        parent_command = f.read().split(b"\0")[0].decode(errors="replace")
    seen = {
        "ray": sorted(k for k in os.environ if k.startswith("RAY_")),
        "shown": {name: os.environ.get(name) for name in args.show},
        "parent": {"pid": parent, "command": parent_command,
                   "ray": sorted(k for k in parent_names if k.startswith("RAY_"))},
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank-{os.environ['RANK']}.json")
    with open(path + ".partial", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".partial", path)


if __name__ == "__main__":
    main()
