"""The benchmark scripts' shared study runner: what its JSON says about a study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.common import run_study


def test_describe_lists_every_trial_in_order_with_its_status(ray_session: None) -> None:
    spec = {
        "name": "bench-common-noop",
        "workload": "noop",
        "args": {"faults": {"2": "raise"}},
        "objectives": [{"metric": "score"}],
        "budget": {"trials": 6},
        "sampler": "random",
        "seed": 3,
        "resources": {"workers": 1},
    }
    study = run_study(spec, quiet=True)
    described = study.describe()
    json.dumps(described)  # what the scripts write
    rows = described["trials"]
    assert [r["trial"] for r in rows] == sorted(t.number for t in study.trials) and len(rows) >= 6
    by_number = {r["trial"]: r for r in rows}
    assert by_number[2]["status"] == "runtime_error" and by_number[2]["metrics"] == {}
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all("score" in r["metrics"] and set(r["params"]) >= {"x", "tile"} for r in ok)
    assert [f["trial"] for f in described["failures"]] == [2]


def test_gpu_tests_records_a_run_killed_at_its_timeout(tmp_path: Path) -> None:
    """``bench/gpu_tests.py --timeout``: a test that never returns (as a kernel that hangs in the driver) is killed
    at the limit and recorded as timed out, exit status 124, instead of taking the whole device call with it."""
    (tmp_path / "test_hangs.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_hangs():\n    time.sleep(120)\n"
    )
    out = tmp_path / "gpu-tests.json"
    root = Path(__file__).resolve().parent.parent
    script = [sys.executable, "bench/gpu_tests.py", "--out", str(out), "--timeout", "5"]
    run = subprocess.run(
        [*script, "--", str(tmp_path / "test_hangs.py")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 124, run.stderr[-2000:]
    recorded = json.loads(out.read_text())
    assert recorded["returncode"] == 124 and recorded["result"].startswith("timed out after 5 s")
    assert recorded["fingerprint"] and "--timeout 5" in recorded["command"]
