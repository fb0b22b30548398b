"""``bench/run_suite.py``: a step that runs kernel modes no GPU has run yet waits for those modes' GPU tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run_suite


def test_every_step_named_in_after_exists_and_comes_after_its_tests() -> None:
    order = [name for name, _, _ in run_suite.STEPS]
    for step, tests in run_suite.AFTER.items():
        assert step in order and tests in order and order.index(tests) < order.index(step), (step, tests)


@pytest.mark.parametrize(("tests_exit", "ran"), [(0, True), (1, False)])
def test_a_step_runs_only_once_its_tests_passed(tmp_path: Path, monkeypatch: Any, tests_exit: int, ran: bool) -> None:
    """Real subprocesses: the tests step exits 0 or 1; the step after it runs (and writes its file) only after 0.
    ``--passed`` lets a later run start with the step alone."""
    marker = tmp_path / "ran"
    steps = [
        ("tests", 1, ["-c", f"import sys; sys.exit({tests_exit})"]),
        ("measure", 1, ["-c", f"open({str(marker)!r}, 'w').write('1')"]),
    ]
    monkeypatch.setattr(run_suite, "STEPS", steps)
    monkeypatch.setattr(run_suite, "AFTER", {"measure": "tests"})
    monkeypatch.setattr(sys, "argv", ["run_suite.py", "--budget-s", "60", "--out-dir", str(tmp_path / "out")])
    run_suite.main()
    record = {r["step"]: r for r in json.loads((tmp_path / "out" / "suite.json").read_text())}
    assert record["tests"]["status"] == ("ok" if tests_exit == 0 else "exit 1")
    assert marker.exists() == ran
    assert (record["measure"]["status"] == "ok") == ran
    if not ran:
        assert "after tests passed" in record["measure"]["reason"]
        monkeypatch.setattr(sys, "argv", ["run_suite.py", "--out-dir", str(tmp_path / "again"), "--only", "measure",
                                          "--passed", "tests"])  # fmt: skip
        run_suite.main()
        assert marker.exists()
