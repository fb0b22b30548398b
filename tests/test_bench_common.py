"""The benchmark scripts' shared study runner: what its JSON says about a study."""

from __future__ import annotations

import json

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
