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
    elapsed_s: float
    eta_s: float | None
    message: str | None
    url: str
    dashboard_url: str


class StudyDetail(StudyOut):
    spec: dict[str, Any]
    space: dict[str, Any]
    space_hash: str
    device: dict[str, Any] | None
    fingerprint: dict[str, Any] | None


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


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int
    limit: int
    offset: int


class ParetoOut(BaseModel):
    objectives: list[ObjectiveOut]
    trials: list[TrialOut]
    default_pick: int | None


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
