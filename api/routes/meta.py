"""Workloads, health and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select, text

from api.deps import DBDep, require_read
from api.schemas import HealthOut, MetricOut, WorkloadOut
from tuner.store.storage import STUDY_STATUSES, StudyRow, TrialRow, is_transient
from tuner.study.space import compile_space, load_space_file
from tuner.workloads.registry import workload_class, workload_names

router = APIRouter(tags=["meta"])
DURATION_BUCKETS_S = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


@router.get("/api/workloads", response_model=list[WorkloadOut], dependencies=[Depends(require_read)])
def list_workloads() -> list[WorkloadOut]:
    """Every registered workload with its default space, metrics and their directions."""
    out = []
    for name in workload_names():
        cls = workload_class(name)
        # A workload without a space file (replay) takes its space and metrics from its args.
        space = compile_space(load_space_file(cls.space_file)) if cls.space_file else None
        out.append(
            WorkloadOut(
                name=name,
                description=cls.description,
                metrics=[
                    MetricOut(name=m.name, direction=m.direction, unit=m.unit, description=m.description)
                    for m in cls.metrics
                ],
                params=list(space.params) if space else [],
                space=space.canonical if space else {},
                space_points=space.size() if space else None,
            )
        )
    return out


@router.get(
    "/healthz",
    response_model=HealthOut,
    response_model_exclude_none=True,
    responses={503: {"model": HealthOut, "description": "with `?strict=1`: the service is degraded"}},
)
def healthz(db: DBDep, request: Request, response: Response, strict: Annotated[bool, Query()] = False) -> HealthOut:
    """Liveness and what the service depends on: the database's reachability and the runner's state. Always
    200 while the server answers (liveness); ``?strict=1`` (readiness, for a load balancer or an orchestrator's
    probe): 503 while ``degraded``, with the same body."""
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        db_state = "ok"
    except Exception as exc:
        if not is_transient(exc):
            raise
        db_state = "unreachable"
    supervisor = getattr(request.app.state, "runner", None)
    runner = supervisor.state if supervisor is not None else None
    ok = db_state == "ok" and runner in (None, "running")
    if strict and not ok:
        response.status_code = 503
    return HealthOut(status="ok" if ok else "degraded", db=db_state, runner=runner)


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(require_read)],
    responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
)
def metrics(db: DBDep) -> PlainTextResponse:
    """Prometheus text: studies and trials by status, trial durations, queue depth."""
    with db.Session() as s:
        studies = dict(s.execute(select(StudyRow.status, func.count()).group_by(StudyRow.status)).all())
        trials = dict(s.execute(select(TrialRow.status, func.count()).group_by(TrialRow.status)).all())
        spans = s.execute(
            select(TrialRow.started_at, TrialRow.finished_at).where(
                TrialRow.finished_at.is_not(None), TrialRow.worker.is_not(None)
            )
        ).all()
    lines = ["# HELP tuner_studies Studies by status.", "# TYPE tuner_studies gauge"]
    lines += [f'tuner_studies{{status="{st}"}} {studies.get(st, 0)}' for st in STUDY_STATUSES]
    lines += ["# HELP tuner_trials Trials by status.", "# TYPE tuner_trials gauge"]
    lines += [f'tuner_trials{{status="{st}"}} {n}' for st, n in sorted(trials.items())]
    lines += ["# HELP tuner_queue_depth Studies waiting for an orchestrator.", "# TYPE tuner_queue_depth gauge"]
    lines.append(f"tuner_queue_depth {studies.get('queued', 0)}")
    durations = [max(0.0, (end - start).total_seconds()) for start, end in spans if start and end]
    lines += [
        "# HELP tuner_trial_duration_seconds Wall time of measured trials.",
        "# TYPE tuner_trial_duration_seconds histogram",
    ]
    for bound in DURATION_BUCKETS_S:
        lines.append(f'tuner_trial_duration_seconds_bucket{{le="{bound}"}} {sum(d <= bound for d in durations)}')
    lines.append(f'tuner_trial_duration_seconds_bucket{{le="+Inf"}} {len(durations)}')
    lines.append(f"tuner_trial_duration_seconds_sum {sum(durations):.6f}")
    lines.append(f"tuner_trial_duration_seconds_count {len(durations)}")
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
