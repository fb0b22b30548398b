"""The registry's warm start and regression watch, the parts a study and a runner take on their own: the
priors the strategy reads (what the nearest shapes' configs measured there), the registry warm start as
the default when comparable entries exist, and the runner's scheduled recheck. SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_configs import CPU, H200, measured_study, noop_study

from api.main import create_app
from api.settings import Settings
from objectives.noop import NoOp
from tuner.best_configs import registry as configs
from tuner.best_configs import warm_start
from tuner.cli import build_parser
from tuner.run import jobs
from tuner.run.orchestrator import Orchestrator
from tuner.store import lifecycle
from tuner.store.storage import StudyDB
from tuner.strategy.adapter import SamplerAdapter
from tuner.study.spec import load_spec

pytestmark = pytest.mark.timeout(300)

ENQUEUED = {"x": 0.1, "tile": 16, "stages": 1, "mode": "fast"}  # a registry config, poor at this shape


def source_priors(n: int = 40) -> list[dict[str, Any]]:
    """What ``n`` configs measured at another shape: noop's score there, on another scale (3 x + 5)."""
    import numpy as np

    from tuner.strategy.candidates import FeasibleSet

    feasible = FeasibleSet(load_spec(noop_spec(0)).space)
    rows = feasible.sample(np.random.default_rng(1), n, set())
    out = []
    for row in rows:
        config = feasible.encoder.config(row)
        metrics = {"score": 3 * NoOp.reference(config) + 5}
        out.append({"config": config, "status": "ok", "metrics": metrics, "source": "study-a", "distance": 1.0})
    out.append({"config": {**ENQUEUED, "tile": 256}, "status": "compile_error", "metrics": {}, "source": "study-a"})
    return out


def noop_spec(seed: int, **changes: Any) -> dict[str, Any]:
    spec = {"name": "priors", "workload": "noop", "objectives": [{"metric": "score"}], "budget": {"trials": 30}}
    return {**spec, "seed": seed, **changes}


def first_proposals(seed: int, priors: list[dict[str, Any]], n: int = 4, **changes: Any) -> list[dict[str, Any]]:
    """The configs a study's sampler proposes first, each told its real noop score before the next ask: the
    registry's config and the space's seed (enqueued), then the strategy's own."""
    origin = {"source": "registry", "entry": 1}
    adapter = SamplerAdapter(
        load_spec(noop_spec(seed, **changes)), [], lambda c: None, warm_configs=[(ENQUEUED, origin)], priors=priors
    )
    proposals = []
    for _ in range(n):
        proposal = adapter.ask()
        proposals.append(proposal.config)
        adapter.tell(proposal.number, "ok", {"score": NoOp.reference(proposal.config)})
    assert len(adapter.trials()) == n  # the priors are no trials of the study's sampler
    assert adapter.origins == {0: origin, 1: {"source": "seed"}}
    return proposals


def test_priors_steer_the_strategys_first_proposals_after_the_enqueued_ones() -> None:
    priors = source_priors()
    best_prior = max(NoOp.reference(p["config"]) for p in priors if p["status"] == "ok")
    with_priors, without = [], []
    for seed in range(4):
        guided = first_proposals(seed, priors)
        plain = first_proposals(seed, [])
        assert guided[:2] == plain[:2] and guided[0] == ENQUEUED  # the enqueued configs first either way
        assert guided[2] != plain[2]
        with_priors.append(NoOp.reference(guided[2]))
        without.append(NoOp.reference(plain[2]))
    # The first proposal after the enqueued one goes where the priors say the good region is: near or past
    # the best config measured there, where the space-filling start lands anywhere.
    assert min(with_priors) >= best_prior - 0.05, (with_priors, best_prior)
    assert statistics.mean(with_priors) > statistics.mean(without) + 0.3, (with_priors, without)


def test_an_optuna_sampler_takes_no_priors_and_says_so() -> None:
    adapter = SamplerAdapter(load_spec(noop_spec(0, sampler="tpe")), [], lambda c: None, priors=source_priors())
    assert "not used" in adapter.priors_note and "tpe" in adapter.priors_note
    auto = SamplerAdapter(load_spec(noop_spec(0)), [], lambda c: None, priors=source_priors())
    assert auto.priors_note.startswith("41 priors from 1 source")


def origins_answer(db_url: str, study_id: int) -> dict[str, Any]:
    app = create_app(Settings(db_url=db_url))
    with TestClient(app) as client:
        answer = client.get(f"/api/configs/origins/{study_id}")
    app.state.db.dispose()
    assert answer.status_code == 200
    return answer.json()


@pytest.mark.usefixtures("ray_session")
def test_a_spec_without_warm_start_takes_the_registry_when_comparable_entries_exist(db_url: str) -> None:
    db = StudyDB(db_url)
    first = Orchestrator(load_spec(noop_study("default-empty")), db, workers=1).run()
    empty = warm_start.load(db, first.study_id)
    assert (empty.requested, empty.mode) == ("auto", "seeds") and "no noop entry" in empty.reason
    assert configs.trial_origins(db, first.study_id)[0] == {"source": "seed"}
    (entry,) = configs.list_entries(db, workload="noop")[1]  # the completed study published its pick

    second = Orchestrator(load_spec(noop_study("default-registry", seed=5)), db, workers=1).run()
    start = warm_start.load(db, second.study_id)
    assert start.mode == "registry" and start.reason.startswith("default (auto): 1 comparable registry entry")
    trials = sorted(db.trials(second.study_id), key=lambda t: t.number)
    assert trials[0].params == entry.config
    assert configs.trial_origins(db, second.study_id)[0]["entry"] == entry.id
    ok_source_trials = [t for t in db.trials(first.study_id) if t.status == "ok" and t.duplicate_of is None]
    assert len(start.priors) == len(ok_source_trials) and "read by the strategy" in start.priors_note
    # the priors are no trials of this study: its rows are its own proposals only
    assert len(trials) == len({t.number for t in trials}) <= 6
    answer = origins_answer(db_url, second.study_id)["warm_start"]
    assert answer["mode"] == "registry" and answer["entries"] == [entry.id] and answer["priors"] == len(start.priors)

    # Explicit values keep their meaning.
    seeds = Orchestrator(load_spec(noop_study("explicit-seeds", warm_start=True, publish=False)), db, workers=1).run()
    assert warm_start.load(db, seeds.study_id).mode == "seeds"
    assert configs.trial_origins(db, seeds.study_id)[0] == {"source": "seed"}
    off = Orchestrator(load_spec(noop_study("explicit-off", warm_start=False, publish=False)), db, workers=1).run()
    assert warm_start.load(db, off.study_id).reason == "warm_start: false"
    assert configs.trial_origins(db, off.study_id) == {}
    db.dispose()


def test_the_default_reads_only_entries_comparable_with_the_device_and_a_resume_keeps_its_decision(
    db_url: str,
) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    tile = {"BLOCK": 256, "num_warps": 2, "precision": "fp32"}
    configs.publish(db, measured_study(db, "axpy-cpu", {"n": 1024}, [(tile, 1.0)], workload="axpy", device=CPU))
    spec = {"name": "axpy-2048", "workload": "axpy", "args": {"n": 2048}, "objectives": [{"metric": "gbps"}]}
    compiled = load_spec(spec)
    study = db.create_study(
        name="axpy-2048", workload="axpy", spec=spec, space={}, space_hash="h", objectives=[("gbps", "maximize")]
    )
    on_cpu = warm_start.plan(db, compiled, CPU, study.id, fresh=True)
    assert on_cpu.mode == "registry" and on_cpu.configs[0][0] == tile
    on_gpu = warm_start.plan(db, compiled, H200, study.id, fresh=True)
    assert on_gpu.mode == "seeds" and "on NVIDIA H200" in on_gpu.reason  # the cpu entry is not comparable
    gpu_tile = {**tile, "BLOCK": 1024}
    configs.publish(
        db, measured_study(db, "axpy-h200", {"n": 4096}, [(gpu_tile, 900.0)], workload="axpy", metric="gbps")
    )
    on_gpu = warm_start.plan(db, compiled, H200, study.id, fresh=True)
    assert on_gpu.mode == "registry" and on_gpu.configs[0][0] == gpu_tile and on_gpu.priors[0]["distance"] == 1.0
    without = warm_start.plan(db, load_spec({**spec, "warm_start_priors": False}), H200, study.id, fresh=True)
    assert without.configs == on_gpu.configs and without.priors == [] and "warm_start_priors" in without.priors_note
    far = load_spec({**spec, "args": {"n": 2**20}})  # beyond the bound: no entry is near
    assert warm_start.plan(db, far, H200, study.id, fresh=True).mode == "seeds"

    warm_start.save(db, study.id, on_gpu)
    configs.publish(db, measured_study(db, "axpy-h200-2048", {"n": 2048}, [(tile, 950.0)], workload="axpy"))
    resumed = warm_start.plan(db, compiled, H200, study.id, fresh=False)  # the stored decision, not a new one
    assert resumed.configs == on_gpu.configs and resumed.priors == on_gpu.priors and resumed.reason == on_gpu.reason
    db.dispose()


def recheck_entry(db: StudyDB) -> int:
    """A noop entry measured on this machine (cpu) at its true score: what the recheck measures again."""
    config = {"x": 0.7, "tile": 64, "stages": 3, "mode": "balanced"}
    study = measured_study(
        db, "noop-entry", {}, [(config, NoOp.reference(config))], workload="noop", metric="score", device=CPU
    )
    return configs.publish(db, study).entry.id


def run_runner(runner: Any, until: Any, timeout_s: float = 120) -> None:
    thread = threading.Thread(target=runner.run_forever, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not until() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert until(), "the runner did not get there in time"
    finally:
        runner.stop()
        thread.join(timeout=60)


@pytest.mark.usefixtures("ray_session")
def test_the_runner_rechecks_on_its_schedule_between_studies_and_a_restart_waits(db_url: str) -> None:
    from tuner.run.service import StudyRunner

    db = StudyDB(db_url)
    db.create_tables()
    entry_id = recheck_entry(db)
    compiled = load_spec(noop_study("queued-first", budget={"trials": 3, "trial_timeout_s": 30}, publish=False))
    queued, _ = lifecycle.submit(
        db,
        name=compiled.spec.name,
        workload="noop",
        spec=compiled.spec.model_dump(mode="json"),
        space=compiled.space.canonical,
        space_hash=compiled.space.hash,
        objectives=compiled.objectives,
    )

    # noop's drift lowers every score by 0.25: a regression the recheck must flag.
    runner = StudyRunner(db, poll_s=0.1, workers=1, recheck_every_s=3600, recheck_args={"drift": 0.25})
    run_runner(runner, lambda: (jobs.job_state(db) or {}).get("finished_at") is not None)
    study = db.get_study(queued.id)
    state = jobs.job_state(db)
    assert study.status == "completed"  # the queued study ran first
    assert dt.datetime.fromisoformat(state["started_at"]) >= study.updated_at - dt.timedelta(seconds=1)
    assert state["owner"] == runner.owner and state["every_s"] == 3600 and not state["running"]
    (flagged,) = state["result"]["regressed"]
    assert flagged["entry"] == entry_id and flagged["now"]["high"] < flagged["was"]["low"]
    assert state["result"]["checked"] == state["result"]["entries"] == 1
    assert configs.get_entry(db, entry_id).status == "regressed"
    answer = TestClient(create_app(Settings(db_url=db_url))).get("/api/configs/recheck").json()
    assert answer["scheduled"] and answer["result"]["regressed"][0]["entry"] == entry_id

    # A restarted runner finds the last run in the database: not due for an hour, so nothing is measured.
    again = StudyRunner(db, poll_s=0.1, recheck_every_s=3600)
    assert again.recheck.step() is False and jobs.job_state(db)["started_at"] == state["started_at"]
    # On a short schedule it is due again; measured without the drift, the entry is ok once more.
    time.sleep(1.1)
    short = StudyRunner(db, poll_s=0.1, recheck_every_s=1)
    run_runner(short, lambda: jobs.job_state(db)["owner"] == short.owner and not jobs.job_state(db)["running"])
    assert jobs.job_state(db)["result"]["verdicts"] == {"ok": 1} and configs.get_entry(db, entry_id).status == "ok"
    db.dispose()


def test_recheck_every_takes_a_duration_and_serve_passes_it_to_its_runner() -> None:
    parser = build_parser()
    assert parser.parse_args(["worker", "--recheck-every", "24h"]).recheck_every == 86400
    assert parser.parse_args(["serve", "--recheck-every", "90"]).recheck_every == 90
    assert parser.parse_args(["worker"]).recheck_every is None  # off by default
    assert jobs.parse_duration("30m") == 1800 and jobs.parse_duration("1.5d") == 129600
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--recheck-every", "soon"])
