"""Multi-GPU trials on the CPU: gangs of gloo ranks under the real orchestrator, with real faults.

A study of the ``collective`` workload with ``resources.gpus_per_trial: 2`` runs each trial as two
fresh rank processes (tuner/run/gang.py). A rank that never joins the collective leaves the other blocked
in it until the process-group timeout (``timeout``); a rank that exits mid-trial makes the trial
``worker_lost`` and the other rank is ended; the gang worker takes the next trial and the study
completes its budget, re-measurement included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tuner.run.gang import PROTECTED_ENV, _merge, gang_deadline_s, pg_timeout_s, rank_env
from tuner.run.orchestrator import Orchestrator
from tuner.store.storage import StudyDB
from tuner.study.spec import SpecError, load_spec

DEFAULTS = {
    "NCCL_ALGO": "default",
    "NCCL_PROTO": "default",
    "NCCL_MIN_NCHANNELS": "default",
    "NCCL_MAX_NCHANNELS": "default",
    "NCCL_BUFFSIZE": "default",
    "NCCL_NTHREADS": "default",
}


def collective_spec(name: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "workload": "collective",
        "args": {
            "op": "all_reduce",
            "size_bytes": 4096,
            "dtype": "fp32",
            "world_size": 2,
            "iters": 3,
            "warmup_iters": 1,
            "timeout_s": 3,
        },
        "objectives": [{"metric": "busbw_gbps"}],
        "budget": {"trials": 4, "trial_timeout_s": 30},
        "sampler": "random",
        "seed": 0,  # its first four proposals are statically feasible: faults 1 and 2 hit real trials
        "resources": {"gpus_per_trial": 2},
    }
    spec.update(changes)
    return spec


def test_rank_env_sets_knobs_unsets_defaults_and_never_touches_multicast() -> None:
    base = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0", "PATH": "/bin"}
    trial = {"NCCL_ALGO": None, "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "1", "NVSHMEM_DISABLE_NVLS": None}
    env = rank_env(base, trial, rank=1, world_size=2, port=12345)
    assert "NCCL_ALGO" not in env  # "default" = unset, even when the caller's environment set it
    assert env["NCCL_PROTO"] == "Simple"
    assert env["NCCL_NVLS_ENABLE"] == "0" and "NVSHMEM_DISABLE_NVLS" not in env  # inherited as they were
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"], env["LOCAL_RANK"]) == ("1", "2", "12345", "1")
    assert env["PATH"] == "/bin" and set(PROTECTED_ENV) >= {"NCCL_NVLS_ENABLE"}


def test_timeouts_end_the_trial_before_the_orchestrator_does() -> None:
    class W:
        timeout_s = None

    assert pg_timeout_s(W(), 300) == 60 and pg_timeout_s(W(), 20) == 8 and pg_timeout_s(W(), 5) == 5
    W.timeout_s = 2.5
    assert pg_timeout_s(W(), 300) == 2.5
    for t in (5, 30, 300):
        assert 0 < gang_deadline_s(t) < t


def test_merge_blames_the_dead_rank_not_the_ones_it_broke(tmp_path: Path) -> None:
    logs = [tmp_path / "r0.log", tmp_path / "r1.log"]
    for log in logs:
        log.write_text("")
    ok = {
        "status": "ok",
        "metrics": {"busbw_gbps": 1.0},
        "samples_ms": [1.0],
        "error": None,
        "timing_comparable": False,
    }
    broken = {"status": "runtime_error", "metrics": {}, "samples_ms": [], "error": "Connection closed by peer"}
    out = _merge([broken, None], [0, 7], set(), False, 10, 3, logs)
    assert out["status"] == "worker_lost" and "rank 1" in out["error"] and "exit code 7" in out["error"]
    out = _merge([{**broken, "status": "timeout", "error": "Timed out"}, None], [0, -9], {1}, False, 10, 3, logs)
    assert out["status"] == "timeout" and "ranks [1] killed" in out["error"]
    out = _merge([None, None], [-9, -9], {0, 1}, True, 10, 3, logs)
    assert out["status"] == "timeout"
    logs[1].write_text("[PG 0 Rank 1] Watchdog caught collective operation timeout: WorkNCCL(...)")
    assert _merge([broken, None], [0, -6], set(), False, 10, 3, logs)["status"] == "timeout"
    out = _merge([ok, {**ok, "status": "numerics_fail", "error": "rank 1: wrong"}], [0, 0], set(), False, 10, 3, logs)
    assert out["status"] == "numerics_fail" and "rank 1" in out["error"]
    out = _merge([ok, ok], [0, 0], set(), False, 10, 3, logs)
    assert out["status"] == "ok" and out["metrics"] == {"busbw_gbps": 1.0}


def test_spec_ties_world_size_to_gpus_per_trial() -> None:
    with pytest.raises(SpecError, match=r"args\.world_size"):
        load_spec(collective_spec("x", resources={"gpus_per_trial": 4}))
    with pytest.raises(SpecError, match="gpus_per_trial"):
        load_spec(
            {"name": "n", "workload": "noop", "objectives": [{"metric": "score"}], "resources": {"gpus_per_trial": 2}}
        )
    with pytest.raises(SpecError, match="gpus_per_trial"):
        load_spec(collective_spec("x", resources={"gpus_per_trial": 9}))
    assert load_spec(collective_spec("x")).spec.resources.gpus_per_trial == 2


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("ray_session")
def test_gang_study_with_a_hung_collective_and_a_dead_rank_completes(sqlite_url: str) -> None:
    spec = collective_spec("gang-faults", remeasure={"top_k": 2, "rounds": 1})
    spec["args"]["faults"] = {"1": "hang", "2": "die"}
    db = StudyDB(sqlite_url)
    summary = Orchestrator(load_spec(spec), db).run()
    trials = {t.number: t for t in db.trials(summary.study_id)}
    assert summary.status == "completed"
    measured = [t for t in trials.values() if t.status != "infeasible_static" and t.duplicate_of is None]
    assert len(measured) == 4
    assert trials[0].params == DEFAULTS and trials[0].status == "ok"  # NCCL's defaults first (the seed)
    assert trials[1].status == "timeout" and "Timed out" in trials[1].error and "killed" in trials[1].error
    assert trials[2].status == "worker_lost" and "rank 1 died" in trials[2].error
    ok = [t for t in measured if t.status == "ok"]
    assert len(ok) == 2 and all(t.number in (0, 3) for t in ok)
    for t in ok:
        # all_reduce of 4096 bytes over 2 ranks: busbw = algbw * 2(n-1)/n = algbw
        assert t.metrics["busbw_gbps"] == pytest.approx(t.metrics["algbw_gbps"])
        assert t.metrics["latency_us"] > 0 and t.timing_comparable is False
        assert t.fingerprint["world_size"] == 2 and t.fingerprint["backend"] == "gloo"
    assert {t.worker for t in measured} == {"w0.0"}  # one gang, never replaced: the faults ended only ranks
    remeasured = [t for t in ok if t.remeasured]
    assert len(remeasured) == 2 and all(t.remeasured["rounds"] == 1 for t in remeasured)
    study = db.find_study("gang-faults")
    assert study.fingerprint["world_size"] == 2
    db.dispose()


def test_no_rank_process_outlives_its_trial() -> None:
    """The rank processes of earlier tests are gone (killed with their session or exited)."""
    out = os.popen("ps -eo args").read()
    assert "tuner.run.gang_rank" not in out
