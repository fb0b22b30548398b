"""Response models: what the API promises, published in its OpenAPI schema."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel


class ObjectiveOut(BaseModel):
    metric: str
    direction: str


class BestOut(BaseModel):
    trial: int
    params: dict[str, Any]
    metrics: dict[str, float | None]


class StudyOut(BaseModel):
    id: int
    name: str
    workload: str
    status: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    objectives: list[ObjectiveOut]
    budget_trials: int
    measured: int
    running: int
    counts: dict[str, int]
    progress: float
    best: BestOut | None
    front_size: int = 0  # trials on the Pareto front (for one objective: those tied for best)
    seq: int = 0  # the study's last change: event streams and ``/trials?since=`` go on from it
    elapsed_s: float
    eta_s: float | None
    message: str | None
    error: str | None = None  # why the study cannot be shown in full (e.g. its workload no longer builds)
    url: str
    dashboard_url: str
    # Proposals the sampler replaced inside its proposal step, not trial rows ({"repeats_replaced": n,
    # "static_rejected": m}); null when the study's sampler replaces nothing (``sampler: auto`` does).
    proposals: dict[str, int] | None = None
    # How the study's trials are timed: {"mode": "eager" | "cuda_graph", "means": ...} for a kernel workload (its
    # ``timing`` arg), null for a workload that times a whole step its own way.
    timing: dict[str, str] | None = None


class StudyDetail(StudyOut):
    spec: dict[str, Any]
    space: dict[str, Any]
    space_hash: str
    device: dict[str, Any] | None
    fingerprint: dict[str, Any] | None
    #: The study's markdown note (``PUT /api/studies/{id}/note``), or None.
    note: str | None = None


class StudyPage(BaseModel):
    items: list[StudyOut]
    total: int
    limit: int
    offset: int


class SubmitOut(BaseModel):
    id: int
    name: str
    status: str
    url: str
    dashboard_url: str


class TrialOut(BaseModel):
    number: int
    status: str
    params: dict[str, Any]
    metrics: dict[str, float | None]
    feasible: bool | None
    timing_comparable: bool | None
    error: str | None
    worker: str | None
    attempt: int
    duplicate_of: int | None
    remeasured: dict[str, Any] | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration_s: float | None


class TrialDetail(TrialOut):
    samples_ms: list[float]
    fingerprint: dict[str, Any] | None
    #: What the workload reported beside its metrics: ``timing`` (median_ms, iqr_ms, ci95_ms, reps,
    #: warmup_calls, mode, rel_ci, converged), loss curves, memory facts... Empty for older trials.
    extra: dict[str, Any] = {}
    #: The trial's markdown note (``PUT /api/studies/{id}/trials/{number}/note``), or None.
    note: str | None = None


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int
    limit: int
    offset: int


class ParetoOut(BaseModel):
    """The front, or a part of it: ``trials`` are the front's from ``offset`` on (every ``stride``-th where
    the study page's first draw samples a large front), ``total`` the front's size."""

    objectives: list[ObjectiveOut]
    trials: list[TrialOut]
    default_pick: int | None
    total: int
    offset: int = 0
    stride: int = 1


class PlotPointOut(BaseModel):
    """A trial as the plots draw it: no raw samples, no error text."""

    number: int
    status: str
    feasible: bool | None
    duplicate_of: int | None
    timing_comparable: bool | None
    params: dict[str, Any]
    metrics: dict[str, float | None]


class StudyOverview(BaseModel):
    """What the study page draws first, in one response: the study, the first page of its trial table,
    every trial's plot point, the front, the latest failures, and the change ``seq`` it was read at."""

    study: StudyDetail
    trials: TrialPage
    points: list[PlotPointOut]
    points_stride: int = 1  # 1: every trial; k: every k-th trial (by number) and every front trial
    pareto: ParetoOut
    failures: list[TrialOut]
    seq: int


class ImportanceOut(BaseModel):
    importances: dict[str, float]


class MetricOut(BaseModel):
    name: str
    direction: str
    unit: str
    description: str


class WorkloadOut(BaseModel):
    name: str
    description: str
    metrics: list[MetricOut]
    params: list[str]
    space: dict[str, Any]
    space_points: int | None


class HealthOut(BaseModel):
    """``status``: ``ok``, or ``degraded`` when the database cannot be reached or the runner that
    ``tuner serve`` supervises is not running; ``runner``: that runner's state (absent without one)."""

    status: str
    db: str
    runner: str | None = None


class ErrorOut(BaseModel):
    detail: Any
