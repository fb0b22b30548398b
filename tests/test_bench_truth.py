"""bench/truth.py runs under the interpreter on a tiny shape, its figures marked not comparable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.timeout(300)
def test_truth_runs_on_the_interpreter_and_writes_every_target(tmp_path: Path, interpreter: None) -> None:
    from bench import truth

    out = tmp_path / "truth-cpu.json"
    result = truth.main(["--tiny", "--rounds", "1", "--configs", "1", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["comparable"] is False and written["fingerprint"] and written["command"].startswith("python")
    case = written["cases"][0]
    assert case["case"] == "gemm-tiny" and case["reported"]["tuned0"]["status"] == "ok"
    call = case["calls"]["tuned0"]
    assert call["eager_mean_us"] > 0 and call["host_us"] > 0 and call["graph_us"] is None  # no graph on a CPU
    assert result["targets"] == written["targets"] and len(written["targets"]) == 2
    for target in written["targets"]:
        assert set(target) == {"target", "tuned", "baseline", "ratio", "goal", "verdict"}
        assert target["verdict"] in ("met", "missed")
    reported = next(t for t in written["targets"] if "reported vs re-timed" in t["target"])
    assert reported["ratio"] == pytest.approx(min(reported["tuned"], reported["baseline"]) /
                                              max(reported["tuned"], reported["baseline"]))  # fmt: skip
