"""The workload contract's engine side: declared capabilities, one template, one classifier, one wire form.

Every registered workload declares its capabilities as class attributes; every measured workload
(kernel, step, multi-GPU) runs the template of ``tuner/workloads/template.py`` instead of its own ``run``;
exceptions map to statuses in one place (``tuner/workloads/failures.py``); a result crosses processes in
one versioned form that keeps ``extra``, which reaches the database and ``GET /trials/{n}``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tuner.workloads.base import (
    RESULT_VERSION,
    TrialResult,
    TrialStatus,
    Workload,
    json_safe,
    read_report,
)
from tuner.workloads.failures import TrialFailure, classify_exception
from tuner.workloads.rank import RankWorkload
from tuner.workloads.registry import workload_class, workload_names
from tuner.workloads.template import MeasuredWorkload

#: Workloads that are not measurements (a synthetic objective, a recorded landscape) keep their own run.
UNMEASURED = {"noop", "replay"}


def test_capabilities_are_declared_and_measured_workloads_use_the_template() -> None:
    for name in workload_names():
        cls = workload_class(name)
        assert issubclass(cls, Workload) and cls.name == name
        assert isinstance(cls.multi_gpu, bool) and cls.trials_in_flight >= 1 and cls.world_size >= 1
        assert cls.multi_gpu == issubclass(cls, RankWorkload), name
        if name in UNMEASURED:
            continue
        assert issubclass(cls, MeasuredWorkload), name
        assert cls.run is MeasuredWorkload.run, f"{name} writes its own run instead of using the template"


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda's."""


class InductorError(Exception):
    """Named like torch._inductor's."""


class CompilationError(Exception):
    """Named like Triton's."""


class SubCompilationError(CompilationError):
    """The MRO counts, not only the class's own name."""


@pytest.mark.parametrize(
    ("exc", "kwargs", "status"),
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), {}, TrialStatus.OOM),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory"), {}, TrialStatus.OOM),
        (RuntimeError("out of resource: shared memory, Required: 262144"), {}, TrialStatus.OUT_OF_RESOURCES),
        (SubCompilationError("at 3:4: bad layout"), {}, TrialStatus.COMPILE_ERROR),
        (InductorError("LoweringException: ..."), {}, TrialStatus.COMPILE_ERROR),
        (RuntimeError("PassManager::run failed"), {}, TrialStatus.COMPILE_ERROR),
        # torch's CUDA errors all end with "Compile with `TORCH_USE_CUDA_DSA`": still a runtime error
        (
            RuntimeError(
                "CUDA error: an illegal memory access was encountered\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
            ),
            {},
            TrialStatus.RUNTIME_ERROR,
        ),
        (RuntimeError("Timed out waiting 3000ms for recv operation"), {"process_group": True}, TrialStatus.TIMEOUT),
        (RuntimeError("Timed out waiting 3000ms for recv operation"), {}, TrialStatus.RUNTIME_ERROR),
        (KeyError("BLOCK_M"), {"prepare": True}, TrialStatus.COMPILE_ERROR),
        (KeyError("BLOCK_M"), {}, TrialStatus.RUNTIME_ERROR),
        (TrialFailure(TrialStatus.NUMERICS_FAIL, "rank 1 was wrong"), {}, TrialStatus.NUMERICS_FAIL),
    ],
)
def test_one_classifier(exc: BaseException, kwargs: dict[str, bool], status: TrialStatus) -> None:
    assert classify_exception(exc, **kwargs) == status


def test_the_wire_form_is_versioned_and_keeps_extra() -> None:
    result = TrialResult(
        TrialStatus.OK,
        metrics={"gbps": 1.5},
        samples_ms=[0.1, 0.2],
        timing_comparable=False,
        extra={"timing": {"median_ms": 0.15, "ci95_ms": (0.1, 0.2), "rel_ci": math.inf}, "losses": [1.0, math.nan]},
    )
    wire = result.to_wire()
    assert wire["version"] == RESULT_VERSION
    assert wire["extra"] == {
        "timing": {"median_ms": 0.15, "ci95_ms": [0.1, 0.2], "rel_ci": None},
        "losses": [1.0, None],
    }
    back = TrialResult.from_wire(wire)
    assert back.status == TrialStatus.OK and back.extra == wire["extra"] and back.samples_ms == [0.1, 0.2]
    assert read_report({**wire, "worker": "w0.0"})["status"] == "ok"
    stale = read_report({**wire, "version": RESULT_VERSION + 1, "worker": "w0.0"})
    assert stale["status"] == "runtime_error" and "version" in (stale["error"] or "") and stale["worker"] == "w0.0"
    assert read_report(None)["status"] == "runtime_error"
    with pytest.raises(ValueError, match="version"):
        TrialResult.from_wire({"status": "ok"})
    assert json_safe({1: (2, float("nan")), "o": object}) == {"1": [2, None], "o": str(object)}


def test_a_database_at_the_previous_revision_gains_the_extra_column(sqlite_url: str) -> None:
    from tuner.store.migrations import head, upgrade
    from tuner.store.storage import StudyDB

    db = StudyDB(sqlite_url)
    upgrade(db.engine, "0003")
    with db.engine.connect() as conn:
        assert "extra" not in {row[1] for row in conn.execute(text("PRAGMA table_info(tuner_trials)"))}
    db.create_tables()
    assert head() >= "0004"  # the revision that added the column, or a later one
    study = db.create_study(name="s", workload="noop", spec={}, space={}, space_hash="h")
    db.insert_trial(study.id, 0, {"x": 1}, optuna_trial_id=None)
    db.finish_trial(
        study.id,
        0,
        status="ok",
        metrics={"score": 1.0},
        extra={"timing": {"ci95_ms": [1.0, 2.0]}, "bad": math.nan},
        feasible=True,
        timing_comparable=False,
        error=None,
        worker="w",
        attempt=1,
        fingerprint=None,
    )
    assert db.trial(study.id, 0).extra == {"timing": {"ci95_ms": [1.0, 2.0]}, "bad": None}
    db.dispose()


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("ray_session")
def test_the_timing_interval_reaches_the_database_and_the_trial_answer(sqlite_url: str, interpreter: None) -> None:
    """The README's example workload through the engine: each trial's timing summary is stored and served."""
    from api.main import create_app
    from api.settings import Settings
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    spec: dict[str, Any] = {
        "name": "axpy-cpu",
        "workload": "axpy",
        "args": {"n": 1000},
        "objectives": [{"metric": "gbps"}],
        "budget": {"trials": 3, "trial_timeout_s": 120},
        "seed": 1,
        "warm_start": False,
    }
    db = StudyDB(sqlite_url)
    summary = Orchestrator(load_spec(spec), db, workers=1).run()
    ok = [t for t in db.trials(summary.study_id) if t.status == "ok" and t.duplicate_of is None]
    assert summary.status == "completed" and ok
    for trial in ok:
        timing = trial.extra["timing"]
        assert timing["reps"] == len(trial.samples_ms) == 3 and timing["mode"] == "cpu"
        low, high = timing["ci95_ms"]
        assert low <= timing["median_ms"] <= high
    db.dispose()
    app = create_app(Settings(db_url=sqlite_url, token="s3cret-token"))
    with TestClient(app) as client:
        answer = client.get(f"/api/studies/{summary.study_id}/trials/{ok[0].number}").json()
    app.state.db.dispose()
    assert answer["extra"]["timing"] == ok[0].extra["timing"]
