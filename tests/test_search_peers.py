"""bench/search_peers.py: a landscape converted into a Kernel Tuner cache admits exactly its recorded configs, and
the peer comparison runs end to end (2 Kernel Tuner strategies, 2 seeds) with both sides counted alike."""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("kernel_tuner", reason="kernel_tuner is a dev extra (pip install -e .[dev]); not installed")

from bench.search_peers import compare, kt_trials_to, run_kernel_tuner, to_cache

LANDSCAPE = Path(__file__).resolve().parents[1] / "bench" / "landscapes" / "softmax-8192.jsonl"


def _records():
    lines = LANDSCAPE.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:] if line.strip()]


def test_cache_admits_exactly_the_measured_configs():
    header, records = _records()
    metric = header["metrics"][0]["name"]
    cache, admitted = to_cache(LANDSCAPE, metric)
    measured = [r for r in records if r["status"] != "infeasible_static"]
    assert len(cache["cache"]) == len(admitted) == len(measured)
    assert cache["tune_params_keys"] == list(header["grid"])
    for record in measured:
        key = ",".join(str(record["params"].get(n, "absent")) for n in header["grid"])
        entry = cache["cache"][key]
        if record["status"] == "ok":
            assert math.isclose(entry[metric], record["metrics"][metric])
        else:
            assert entry[metric] == "RuntimeFailedConfig"


def test_kernel_tuner_search_stays_inside_the_landscape(tmp_path):
    header, _ = _records()
    metric = header["metrics"][0]["name"]
    cache, admitted = to_cache(LANDSCAPE, metric)
    file = tmp_path / "cache.json"
    file.write_text(json.dumps(cache))
    order = run_kernel_tuner(
        file, admitted, cache["tune_params_keys"], cache["tune_params"], metric, True, "random_sample", 0, 30
    )
    assert len(order) == len(set(order)) == 30  # distinct configs, the budget spent
    assert all(key in cache["cache"] for key in order)
    best = max(v[metric] for v in cache["cache"].values() if isinstance(v[metric], float))
    assert kt_trials_to(order, cache, metric, best * 10, True) is None  # an unreachable target is never reached
    assert kt_trials_to(order, cache, metric, 0.0, True) == next(
        i for i, k in enumerate(order, 1) if isinstance(cache["cache"][k][metric], float)
    )


def test_comparison_on_one_small_landscape(tmp_path):
    target = compare(LANDSCAPE, ["random_sample", "greedy_ils"], seeds=2, budget=60, workdir=tmp_path)
    assert set(target) >= {"target", "tuned", "baseline", "ratio", "goal", "verdict"}
    assert len(target["tuned_trials_to_2pct"]) == 2
    for strategy in ("random_sample", "greedy_ils"):
        needed = target["kernel_tuner"][strategy]["trials_to_2pct"]
        assert len(needed) == 2 and all(n is None or 1 <= n <= 60 for n in needed)
    assert target["verdict"] in ("met", "not met")
    if target["tuned"] is not None and target["baseline"] is not None:
        assert target["ratio"] == round(target["tuned"] / target["baseline"], 3)
