"""Fairness: after a 1,000,000-trial study is submitted, how soon does a 10-trial study submitted next start
its first trial, and does it complete while the huge one still runs (issue 62's target: within 10 s)?

In one process: the REST API (submits through ``POST /api/studies``), a real study runner
(:class:`tuner.run.service.StudyRunner`, default ``--max-studies``) with ``--workers`` Ray CPU workers, an
SQLite database in a temporary folder, the ``noop`` workload with ``--sleep-ms`` per trial.

    PYTHONPATH=. python bench/fairness.py --out bench/results/fairness-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import write_result

HUGE = 1_000_000


def spec(name: str, trials: int, sleep_ms: float) -> dict[str, Any]:
    return {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": sleep_ms},
        "objectives": [{"metric": "score"}],
        "budget": {"trials": trials},
        "sampler": "random",
        "remeasure": {"top_k": 0},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sleep-ms", type=float, default=50.0)
    parser.add_argument("--small-trials", type=int, default=10)
    parser.add_argument("--huge-warm", type=int, default=20, help="trials the huge study finishes first")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")

    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings
    from tuner.run.orchestrator import ensure_ray
    from tuner.run.service import StudyRunner

    token = "fairness-bench-token"
    auth = {"Authorization": f"Bearer {token}"}
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(db_url=f"sqlite:///{Path(tmp) / 'study.db'}", token=token))
        with TestClient(app) as client:
            db = app.state.db
            ensure_ray(None, min_cpus=args.workers)
            runner = StudyRunner(db, poll_s=0.1, workers=args.workers)
            thread = threading.Thread(target=runner.run_forever, daemon=True)
            thread.start()
            deadline = time.monotonic() + args.timeout_s

            def wait(until: Any, what: str) -> float:
                while not until():
                    if time.monotonic() > deadline:
                        raise SystemExit(f"timed out waiting for {what}")
                    time.sleep(0.02)
                return time.monotonic()

            def finished(study_id: int) -> int:
                return sum(n for s, n in db.status_counts(study_id).items() if s != "running")

            def submit(body: dict[str, Any]) -> int:
                response = client.post("/api/studies", json=body, headers=auth)
                response.raise_for_status()
                return response.json()["id"]

            try:
                huge = submit(spec("huge", HUGE, args.sleep_ms))
                wait(lambda: finished(huge) >= args.huge_warm, "the huge study's first trials")
                submitted = time.monotonic()
                small = submit(spec("small", args.small_trials, args.sleep_ms))
                first = wait(lambda: len(db.trials(small)) >= 1, "the small study's first trial")
                huge_at_first = finished(huge)
                done = wait(lambda: db.get_study(small).status in ("completed", "failed"), "the small study's end")
                small_row, huge_row = db.get_study(small), db.get_study(huge)
                result = {
                    "what": "a 10-trial study submitted after a 1,000,000-trial one, on one runner",
                    "max_studies": runner.max_studies,
                    "workers": args.workers,
                    "sleep_ms": args.sleep_ms,
                    "huge_budget": HUGE,
                    "small_first_trial_s": round(first - submitted, 2),
                    "small_complete_s": round(done - submitted, 2),
                    "small_status": small_row.status,
                    "small_measured": client.get(f"/api/studies/{small}").json()["measured"],
                    "huge_status_when_small_done": huge_row.status,
                    "huge_trials_while_small_ran": finished(huge) - huge_at_first,
                    "target_first_trial_s": 10,
                    "target_met": first - submitted <= 10
                    and small_row.status == "completed"
                    and huge_row.status == "running",
                    "cpu_count": os.cpu_count(),
                }
            finally:
                runner.stop()
                thread.join(timeout=120)
            db.dispose()
    print(json.dumps(result, indent=2))
    write_result(result, str(args.out) if args.out else None)  # with the fingerprint, the date and the command
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
