"""``/api/configs``: the best-config registry (tuner/best_configs/registry.py): lookup by shape, list, publish, retract,
and the ``nccl_tuner.conf`` of the collective entries."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import MAX_ID, DBDep, require_read, require_write
from api.schemas import ErrorOut
from tuner.best_configs import answers
from tuner.best_configs import registry as configs
from tuner.workloads.registry import UnknownWorkload, workload_class

router = APIRouter(prefix="/api/configs", tags=["configs"], dependencies=[Depends(require_read)])
#: Query parameters of a lookup that are not the workload's shape args or fixed args.
LOOKUP_PARAMS = frozenset({"workload", "gpu", "top"})  # not "k": a GEMM shape arg
LIST_PARAMS = frozenset({"workload", "gpu", "status", "limit", "offset"})
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
    404: {"model": ErrorOut, "description": "no such entry, or none at or near the shape; the detail says which"},
    422: {"model": ErrorOut, "description": "invalid input; the detail names the parameter"},
}


class ConfigEntryOut(BaseModel):
    """A registry entry: the config, its export form, the figure and interval, and where it came from."""

    model_config = ConfigDict(extra="allow")

    id: int
    workload: str
    shape: dict[str, Any]
    fixed: dict[str, Any]
    gpu: str
    comparable: bool
    fingerprint: dict[str, Any]
    function: str | None = Field(
        default=None, description="dotted name of the function the config is for (null: no one function's)"
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="the config as the function's keyword arguments: fn(a, b, **kwargs)"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the params as the study measured them")
    config: dict[str, Any]
    exported: dict[str, Any]
    objective: str
    direction: str
    value: float | None
    metrics: dict[str, Any]
    interval: dict[str, Any]
    status: str = Field(description="ok, regressed (a recheck measured it below its interval) or unverified")
    recheck: dict[str, Any] | None
    study_id: int | None
    study: str | None
    trial: int | None
    measured_at: str | None
    updated_at: str | None
    distance: float | None = None


class LookupOut(ConfigEntryOut):
    """The best entry at or near the shape (its fields), ``exact``, and every match with its distance."""

    exact: bool
    matches: list[ConfigEntryOut]


class EntryPage(BaseModel):
    total: int
    items: list[ConfigEntryOut]


class PublishIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    study: str = Field(min_length=1, max_length=128, description="the study's name or id")
    trial: int | None = Field(default=None, ge=0, le=MAX_ID, description="default: the study's pick")


class PublishOut(BaseModel):
    action: str
    message: str
    entry: ConfigEntryOut | None
    unverified: list[int]


def _workload_or_404(name: str) -> Any:
    try:
        return workload_class(name)
    except UnknownWorkload as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("", response_model=LookupOut, responses=ERRORS)
def lookup_config(
    request: Request,
    db: DBDep,
    workload: Annotated[str, Query(max_length=64, description="e.g. triton_gemm")],
    gpu: Annotated[str | None, Query(max_length=128, description="e.g. NVIDIA H200; cpu; default: any GPU")] = None,
    top: Annotated[int, Query(ge=1, le=32, description="nearest entries to return")] = 1,
) -> dict[str, Any]:
    """The entry at the shape given by the workload's shape args as query parameters (``exact: true``), else
    the ``top`` nearest with their distance (``exact: false``); other parameters (``precision``) must match
    the entry's fixed args. 404 names what is missing. Entries measured on a CPU only come for ``gpu=cpu``."""
    cls = _workload_or_404(workload)
    rest = {name: value for name, value in request.query_params.items() if name not in LOOKUP_PARAMS}
    shape = {name: rest.pop(name) for name in cls.shape_args if name in rest}
    missing = [name for name in cls.shape_args if name not in shape]
    if missing:
        raise HTTPException(
            422,
            [
                {"loc": ["query", name], "msg": f"{workload}'s shape needs {name}", "type": "missing"}
                for name in missing
            ],
        )
    try:
        found = configs.lookup(db, workload, shape, gpu=gpu, fixed=rest or None, k=top)
    except configs.RegistryError as exc:
        raise HTTPException(404, str(exc)) from None
    return answers.lookup_dict(found)


@router.get("/entries", response_model=EntryPage, responses=ERRORS)
def list_configs(
    request: Request,
    db: DBDep,
    workload: Annotated[str | None, Query(max_length=64)] = None,
    gpu: Annotated[str | None, Query(max_length=128)] = None,
    status: Annotated[str | None, Query(pattern="^(ok|regressed|unverified)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> dict[str, Any]:
    """Entries, newest first; any other query parameter keeps the entries whose shape has that value."""
    shape = {name: value for name, value in request.query_params.items() if name not in LIST_PARAMS}
    total, page = configs.list_entries(
        db, workload=workload, gpu=gpu, status=status, shape=shape, limit=limit, offset=offset
    )
    return {"total": total, "items": [answers.entry_dict(e) for e in page]}


@router.get(
    "/nccl_tuner.conf",
    response_class=Response,
    responses={
        200: {"description": "the CSV file", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **ERRORS,
    },
)
def nccl_tuner_conf(
    db: DBDep, gpu: Annotated[str | None, Query(max_length=128, description="default: any GPU")] = None
) -> PlainTextResponse:
    """The ``collective`` entries as the CSV file of NCCL's example tuner plugin (``NCCL_TUNER_CONFIG_FILE``)."""
    from objectives.collective import render_size_table, size_table

    _, entries = configs.list_entries(db, workload="collective", gpu=gpu, limit=10_000)
    rows = [
        {
            "study": e.study_name,
            "op": e.shape.get("op"),
            "dtype": e.fixed.get("dtype"),
            "size_bytes": e.shape.get("size_bytes"),
            "world_size": e.shape.get("world_size"),
            "params": e.config,
            "metrics": e.metrics,
        }
        for e in entries
        if e.comparable or gpu == configs.CPU
    ]
    if not rows:
        raise HTTPException(404, f"no collective entry{' on ' + gpu if gpu else ''} in the registry")
    return PlainTextResponse(render_size_table(size_table(rows), "csv"))


class OriginsOut(BaseModel):
    study_id: int
    origins: list[dict[str, Any]] = Field(description="warm-started trials: number, source (registry or seed), ...")
    warm_start: dict[str, Any] | None = Field(
        default=None,
        description="the warm start the study took at its first start: requested (the spec's value), mode "
        "(registry, seeds or off), reason, entries (the registry entries enqueued), priors (how many configs "
        "measured at other shapes the strategy read) and priors_note; null before the study started",
    )


@router.get("/origins/{study_id}", response_model=OriginsOut, responses=ERRORS)
def study_origins(study_id: Annotated[int, Path(ge=1, le=MAX_ID)], db: DBDep) -> dict[str, Any]:
    """Where a study's warm-started trials came from: a registry entry at another shape (its id, shape,
    distance and figure there) or a seed of the space; trials not listed came from the search. With the
    warm start the study took and why."""
    from tuner.best_configs.warm_start import decision_of

    if db.get_study(study_id) is None:
        raise HTTPException(404, f"no study {study_id}")
    origins = configs.trial_origins(db, study_id)
    return {
        "study_id": study_id,
        "origins": [{"number": n, **origins[n]} for n in sorted(origins)],
        "warm_start": decision_of(db, study_id),
    }


class RecheckJobOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    scheduled: bool = Field(description="whether a runner has ever run the scheduled recheck on this database")
    every_s: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    running: bool = False
    owner: str | None = None
    next_due_at: str | None = None
    result: dict[str, Any] | None = Field(
        default=None, description="entries, checked, verdicts, regressed (entry, was, now), failed, unverified"
    )


@router.get("/recheck", response_model=RecheckJobOut, responses=ERRORS)
def recheck_job(db: DBDep) -> dict[str, Any]:
    """The runner's scheduled recheck (``tuner serve --recheck-every``): when its last run began and ended,
    which runner ran it, what it flagged, and when the next is due."""
    from tuner.run.jobs import job_state

    state = job_state(db)
    return {"scheduled": False} if state is None else {"scheduled": True, **state}


@router.get("/{entry_id}", response_model=ConfigEntryOut, responses=ERRORS)
def get_config(entry_id: Annotated[int, Path(ge=1, le=MAX_ID)], db: DBDep) -> dict[str, Any]:
    entry = configs.get_entry(db, entry_id)
    if entry is None:
        raise HTTPException(404, f"no registry entry {entry_id}")
    return answers.entry_dict(entry)


@router.delete("/{entry_id}", status_code=204, dependencies=[Depends(require_write)], responses=ERRORS)
def retract_config(entry_id: Annotated[int, Path(ge=1, le=MAX_ID)], db: DBDep) -> Response:
    """Retract an entry (its study and trials stay)."""
    if not configs.retract(db, entry_id):
        raise HTTPException(404, f"no registry entry {entry_id}")
    return Response(status_code=204)


class RetuneOut(BaseModel):
    id: int
    name: str
    status: str
    url: str
    dashboard_url: str


@router.post(
    "/{entry_id}/retune",
    status_code=202,
    response_model=RetuneOut,
    dependencies=[Depends(require_write)],
    responses={**ERRORS, 409: {"model": ErrorOut, "description": "a study of that name exists"}},
)
def retune_config(entry_id: Annotated[int, Path(ge=1, le=MAX_ID)], db: DBDep) -> dict[str, Any]:
    """Queue a study of the entry's shape again (its study's spec, warm-started from the registry): what a
    regressed or unverified entry calls for. It publishes its pick when it completes."""
    from tuner.store import lifecycle
    from tuner.study.spec import SpecError, StudySpec, compile_study

    entry = configs.get_entry(db, entry_id)
    if entry is None:
        raise HTTPException(404, f"no registry entry {entry_id}")
    spec = configs.retune_spec(db, entry)
    try:
        compiled = compile_study(StudySpec.model_validate(spec))
    except (SpecError, ValueError) as exc:  # the workload changed since: its spec no longer compiles
        raise HTTPException(422, f"entry {entry_id}'s study spec no longer runs: {exc}") from None
    try:
        row, _ = lifecycle.submit(
            db,
            name=compiled.spec.name,
            workload=compiled.spec.workload,
            spec=compiled.spec.model_dump(mode="json"),
            space=compiled.space.canonical,
            space_hash=compiled.space.hash,
            objectives=compiled.objectives,
        )
    except lifecycle.NameTaken as exc:
        raise HTTPException(409, str(exc)) from None
    return {"id": row.id, "name": row.name, "status": row.status, "url": f"/api/studies/{row.id}",
            "dashboard_url": f"/studies/{row.id}"}  # fmt: skip


@router.post(
    "",
    response_model=PublishOut,
    dependencies=[Depends(require_write)],
    responses={
        **ERRORS,
        400: {"model": ErrorOut, "description": "the body is not JSON"},
        413: {"model": ErrorOut, "description": "the body is larger than 1 MiB"},
    },
)
def publish_config(body: PublishIn, db: DBDep) -> dict[str, Any]:
    """Publish a study's pick (or one of its trials) as the entry of its shape, replacing the one there."""
    try:
        done = configs.publish(db, body.study, body.trial)
    except (configs.RegistryError, UnknownWorkload) as exc:
        raise HTTPException(404, str(exc)) from None
    except (TypeError, ValueError) as exc:  # a study whose args its workload no longer takes
        raise HTTPException(422, f"study {body.study}: {exc}") from None
    entry = answers.entry_dict(done.entry) if done.entry is not None else None
    return {"action": done.action, "message": done.message, "entry": entry, "unverified": done.unverified}
