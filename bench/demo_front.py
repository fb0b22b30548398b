"""How soon the demo shows its Pareto front: run ``scripts/demo.sh`` and poll the replay study's front.

Starts the demo on a fresh database and port, notes when it prints the dashboard URL, then polls
``GET /api/studies/{id}`` (its ``front_size`` and counts) every half second: the seconds after the URL at which the
first trial finished and the front reached 2, 5 and 8 points, and when the study completed. Writes JSON with
the machine's load average.

    python bench/demo_front.py --out bench/results/demo-front-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_result  # noqa: E402


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, default=8857)
    parser.add_argument("--limit-s", type=float, default=240.0, help="stop polling this long after the URL")
    ns = parser.parse_args()
    db = Path(tempfile.mkdtemp()) / "demo.db"
    env = {**os.environ, "PORT": str(ns.port), "TUNER_DB_URL": str(db)}
    started = time.monotonic()
    proc = subprocess.Popen(["scripts/demo.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    lines, study_id, url_at = [], None, None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        match = re.search(r"dashboard:\s+http://127\.0\.0\.1:\d+/studies/(\d+)", line)
        if match:
            study_id, url_at = int(match.group(1)), time.monotonic()
            break
    marks: dict[str, float | None] = {"first_trial_s": None, "front_2_s": None, "front_5_s": None,
                                      "front_8_s": None, "complete_s": None}  # fmt: skip
    base = f"http://127.0.0.1:{ns.port}/api/studies/{study_id}"
    front = 0
    try:
        while url_at is not None and time.monotonic() - url_at < ns.limit_s:
            elapsed = round(time.monotonic() - url_at, 1)
            study = _get(base)
            front = int(study.get("front_size") or 0)
            done = int((study.get("counts") or {}).get("ok", 0))
            for key, ok in (("first_trial_s", done > 0), ("front_2_s", front >= 2), ("front_5_s", front >= 5),
                            ("front_8_s", front >= 8), ("complete_s", study.get("status") == "completed")):  # fmt: skip
                if ok and marks[key] is None:
                    marks[key] = elapsed
            if marks["complete_s"] is not None:
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    result = {
        "benchmark": "the demo's replayed front on this machine (scripts/demo.sh, venv set up)",
        "url_after_s": None if url_at is None else round(url_at - started, 1),
        "seconds_after_url": marks,
        "final_front_points": front,
        "load_average": list(os.getloadavg()),
        "demo_output": lines[-12:],
    }
    write_result({**result, "summary": marks}, ns.out)


if __name__ == "__main__":
    main()
