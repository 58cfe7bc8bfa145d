"""Ray's dashboard as a user sees it while a run trains: screenshots of its Jobs and Actors pages,
taken in headless Chromium (the system's, through playwright: `pip install playwright`, no
browser download), and Ray Train's state of the run once it ends.

A warm local cluster of its own (`orchestrator up`, in a temporary state folder) takes
`ray job submit -- orchestrator run jobs/quickstart.yaml`; once the run's workers are up, each page
is opened with the cluster's token (the cookie the dashboard's own prompt sets) and saved as
OUT/dashboard-jobs.png and OUT/dashboard-actors.png. Then the state API's record of the run is
printed, and the cluster is stopped.

    python bench/dashboard_screens.py [--out docs/images] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def api(record: dict, path: str) -> dict:
    request = urllib.request.Request(record["dashboard"] + path, headers={"Authorization": f"Bearer {record['token']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def actors(record: dict) -> list[dict]:
    return api(record, "/api/v0/actors?detail=1&limit=10000")["data"]["result"]["result"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "images"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as scratch:
        env = {**os.environ, "ORCHESTRATOR_STATE_DIR": os.path.join(scratch, "state")}
        orchestrator = [sys.executable, "-m", "orchestrator"]
        print(subprocess.run([*orchestrator, "up"], env=env, cwd=REPO, check=True, capture_output=True,
                             text=True).stdout)
        try:
            with open(os.path.join(env["ORCHESTRATOR_STATE_DIR"], "warm-cluster.json")) as f:
                record = json.load(f)
            submit = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": record["token"]}
            entrypoint = [*orchestrator, "run", "jobs/quickstart.yaml", "--set", f"storage={scratch}/runs"]
            subprocess.run(["ray", "job", "submit", "--address", record["dashboard"], "--no-wait",
                            "--metadata-json", json.dumps({"job_name": "digits-quickstart"}), "--", *entrypoint],
                           env=submit, cwd=REPO, check=True, capture_output=True)
            deadline = time.monotonic() + 300
            while sum(a["class_name"] == "RayTrainWorker" and a["state"] == "ALIVE" for a in actors(record)) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the run's workers did not come up within 300 s")
                time.sleep(1)
            time.sleep(5)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium,
                                                     args=["--no-sandbox", "--disable-gpu"])
                context = browser.new_context(viewport={"width": 1600, "height": 1000})
                context.add_cookies([{"name": "ray-authentication-token", "value": record["token"],
                                      "url": record["dashboard"]}])
                page = context.new_page()
                for name in ("jobs", "actors"):
                    page.goto(f"{record['dashboard']}/#/{name}")
                    page.wait_for_timeout(6000)
                    path = os.path.join(args.out, f"dashboard-{name}.png")
                    page.screenshot(path=path, full_page=True)
                    print(f"{name}: {path}")
                browser.close()
            while not any(r["status"] in ("FINISHED", "ERRORED", "ABORTED")
                          for r in api(record, "/api/train/v2/runs/v1")["train_runs"]):
                time.sleep(2)
            for run in api(record, "/api/train/v2/runs/v1")["train_runs"]:
                workers = [(w["world_rank"], w["node_ip"], w["pid"]) for w in run["attempts"][-1]["workers"]]
                print(f"Ray Train state: {run['name']} {run['status']}; workers (rank, node, pid): {workers}")
            time.sleep(3)  # the driver's own exit
        finally:
            subprocess.run([*orchestrator, "down"], env=env, cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
