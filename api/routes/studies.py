"""``/api/studies``: submit, list, inspect, stop, resume, delete; trials, Pareto front, importances, export.
The event stream of a study (``/api/studies/{id}/events``) is in :mod:`api.streams`."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Response
from fastapi.responses import PlainTextResponse

from api.deps import MAX_ID, DBDep, StudyDep, require_read, require_write
from api.schemas import (
    ErrorOut,
    ImportanceOut,
    ParetoOut,
    StudyDetail,
    StudyOverview,
    StudyPage,
    SubmitOut,
    TrialDetail,
    TrialPage,
)
from api.views import study_out, trial_dict, trial_out, view_out
from tuner.results.export import FRONT_LIMIT, ExportError, ExportRefused, export_document, render
from tuner.store import lifecycle, notes, queries
from tuner.study.spec import SpecError, StudySpec, compile_study

EXPORT_MEDIA_TYPES = {
    "json": "application/json",
    "yaml": "application/yaml",
    "env": "text/plain",
    "python": "text/x-python",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
    404: {"model": ErrorOut, "description": "no such study or trial"},
    422: {"model": ErrorOut, "description": "invalid input; `detail[].loc` names the field"},
}

router = APIRouter(prefix="/api/studies", tags=["studies"], dependencies=[Depends(require_read)])


def _spec_error(exc: SpecError) -> HTTPException:
    return HTTPException(
        422,
        [
            {"loc": ["body", *[p for p in field.split(".") if p]], "msg": msg, "type": "value_error"}
            for field, msg in exc.errors
        ],
    )


@router.post(
    "",
    status_code=202,
    response_model=SubmitOut,
    dependencies=[Depends(require_write)],
    responses={
        **ERRORS,
        400: {"model": ErrorOut, "description": "the body is not JSON"},
        409: {"model": ErrorOut, "description": "a study of that name exists"},
        422: {
            "model": ErrorOut,
            "description": "an invalid spec (`detail[].loc` names the field), or an "
            "Idempotency-Key already used for another spec",
        },
        413: {"model": ErrorOut, "description": "the body is larger than 1 MiB"},
    },
)
def submit_study(
    spec: StudySpec,
    db: DBDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> SubmitOut:
    """Queue a study (the same spec as ``tuner run``); an orchestrator picks it up.

    A retried request with the same ``Idempotency-Key`` returns the study the first one made; the
    same key with a different spec is refused (422). A key is kept for 24 hours, then it may name a
    new request.
    """
    if idempotency_key:  # a key older than its lifetime is released here, so it may name this request
        db.find_by_idempotency_key(idempotency_key, max_age_s=IDEMPOTENCY_KEY_TTL_S)
    try:
        compiled = compile_study(spec)
    except SpecError as exc:
        raise _spec_error(exc) from None
    try:
        row, created = lifecycle.submit(
            db,
            name=spec.name,
            workload=spec.workload,
            spec=spec.model_dump(mode="json"),
            space=compiled.space.canonical,
            space_hash=compiled.space.hash,
            idempotency_key=idempotency_key or None,
            objectives=compiled.objectives,
        )
    except lifecycle.IdempotencyConflict as exc:
        raise HTTPException(422, str(exc)) from None
    except lifecycle.NameTaken as exc:
        raise HTTPException(409, str(exc)) from None
    if created:
        response.headers["Location"] = f"/api/studies/{row.id}"
    return _submitted(row)


#: How long an Idempotency-Key names the study its first request made.
IDEMPOTENCY_KEY_TTL_S = 24 * 3600


def _submitted(row: Any) -> SubmitOut:
    return SubmitOut(
        id=row.id, name=row.name, status=row.status, url=f"/api/studies/{row.id}", dashboard_url=f"/studies/{row.id}"
    )


@router.get("", response_model=StudyPage, responses=ERRORS)
def list_studies(
    db: DBDep,
    status: Literal["queued", "running", "stopping", "completed", "stopped", "failed"] | None = None,
    workload: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> StudyPage:
    """Studies, newest first, paged in SQL; each from its summary (no trial is read)."""
    views, total = queries.study_page(db, status=status, workload=workload, limit=limit, offset=offset)
    return StudyPage(items=[view_out(v, db=db) for v in views], total=total, limit=limit, offset=offset)


@router.get("/{study_id}", response_model=StudyDetail, responses=ERRORS)
def get_study(row: StudyDep, db: DBDep) -> StudyDetail:
    """The study, its summary and its note."""
    return study_out(db, row, detail=True).model_copy(update={"note": notes.note(db, row.id)})  # type: ignore[return-value]


@router.post(
    "/{study_id}/stop",
    status_code=202,
    response_model=StudyDetail,
    dependencies=[Depends(require_write)],
    responses=ERRORS,
)
def stop_study(row: StudyDep, db: DBDep) -> StudyDetail:
    """Ask the orchestrator to stop dispatching (``stopping``, then ``stopped``); trials in flight finish.
    A queued study stops at once; a finished one is left as it is."""
    lifecycle.request_stop(db, row.id)
    return study_out(db, _current(db, row.id), detail=True)  # type: ignore[return-value]


def _current(db: Any, study_id: int) -> Any:
    row = lifecycle.visible(db.get_study(study_id))
    if row is None:
        raise HTTPException(404, f"no study {study_id}")
    return row


@router.post(
    "/{study_id}/resume",
    status_code=202,
    response_model=StudyDetail,
    dependencies=[Depends(require_write)],
    responses={**ERRORS, 409: {"model": ErrorOut, "description": "the study is queued, running or stopping"}},
)
def resume_study(row: StudyDep, db: DBDep) -> StudyDetail:
    """Queue a stopped, failed or completed study again; it goes on to its budget."""
    if not lifecycle.resume(db, row.id):
        raise HTTPException(409, f"study {row.id} is {_current(db, row.id).status}")
    return study_out(db, _current(db, row.id), detail=True)  # type: ignore[return-value]


@router.delete(
    "/{study_id}",
    status_code=204,
    dependencies=[Depends(require_write)],
    responses=ERRORS,
)
def delete_study(row: StudyDep, db: DBDep) -> Response:
    """Delete a study and its trials. A running study is stopped first: it is gone from every read at
    once, and its rows are removed when its runner has stopped."""
    if lifecycle.delete(db, row.id) is None:
        raise HTTPException(404, f"no study {row.id}")
    return Response(status_code=204)


SortParam = Annotated[str, Query(max_length=64, pattern=r"^-?[A-Za-z_][A-Za-z0-9_]*$")]
#: A trial status filter: one of the statuses a trial row may have (a misspelt one is a 422, not an empty page).
TrialStatusParam = Annotated[Literal[queries.TRIAL_STATUSES] | None, Query()]  # type: ignore[valid-type]


def _checked_sort(db: Any, row: Any, sort: str) -> str:
    """``sort`` when it names a key the study's trials have (see :func:`tuner.store.queries.sort_keys`), else 422."""
    keys = queries.sort_keys(db, row, wanted=sort.lstrip("-"))
    if sort.lstrip("-") not in keys:
        raise HTTPException(
            422,
            [
                {
                    "loc": ["query", "sort"],
                    "msg": f"unknown sort key {sort!r}; one of {', '.join(keys)} ('-' first for descending)",
                    "type": "value_error",
                }
            ],
        )
    return sort


@router.get("/{study_id}/trials", response_model=TrialPage, responses=ERRORS)
def list_trials(
    row: StudyDep,
    db: DBDep,
    status: TrialStatusParam = None,
    sort: SortParam = "number",
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> TrialPage:
    """Trials, filtered by status, sorted by ``number``, ``status`` or a metric (``-`` first for descending;
    nulls last; ties by number), paged in SQL. An unknown status or sort key is a 422 naming the known ones."""
    sort = _checked_sort(db, row, sort)
    trials, total = queries.trial_page(db, row.id, status=status, sort=sort, limit=limit, offset=offset)
    return TrialPage(items=[trial_out(t) for t in trials], total=total, limit=limit, offset=offset)


@router.get("/{study_id}/trials/{number}", response_model=TrialDetail, responses=ERRORS)
def get_trial(row: StudyDep, db: DBDep, number: Annotated[int, Path(ge=0, le=MAX_ID)]) -> TrialDetail:
    trial = db.trial(row.id, number)
    if trial is None:
        raise HTTPException(404, f"study {row.id} has no trial {number}")
    return trial_out(trial, detail=True).model_copy(update={"note": notes.note(db, row.id, number)})  # type: ignore[return-value]


#: Front trials ``/pareto`` returns by default (``all=true``: the whole front).
PARETO_PAGE = 100
#: The front's points the study page's first draw gets at most (all of a front this size or smaller).
FRONT_SAMPLE = 300


@router.get("/{study_id}/pareto", response_model=ParetoOut, responses=ERRORS)
def get_pareto(
    row: StudyDep,
    db: DBDep,
    limit: Annotated[int, Query(ge=1, le=10000)] = PARETO_PAGE,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    whole: Annotated[bool, Query(alias="all")] = False,
    sample: Annotated[int | None, Query(ge=1, le=10000)] = None,
) -> Response:
    """The non-dominated feasible trials (for one objective: the best) and the default pick, from the front
    the study's summary keeps: a page of ``limit`` from ``offset`` in front order (ascending in the first
    objective's "smaller is better" value, then the next), ``total`` the front's size; ``all=true``: the
    whole front, however large; ``sample=n``: the whole front up to ``n`` points, else about ``n`` spread
    evenly along it (every ``stride``-th, both ends kept: what the study page draws)."""
    view = queries.study_view(db, row, with_order=True)
    if sample is not None and not whole:
        return _json(_front_sample(db, view, sample))
    front, best, total = queries.front_page(db, view, limit=None if whole else limit, offset=offset)
    return _json(_pareto_dict(view, front, best, total, offset=offset))


def _front_sample(db: Any, view: queries.StudyView, cap: int) -> dict[str, Any]:
    numbers, stride, total = queries.front_sample(view, cap)
    front = queries.trials_by_number(db, view.row.id, numbers)
    return _pareto_dict(view, front, view.summary.pick(), total, stride=stride)


def _json(document: dict[str, Any]) -> Response:
    # Serialised directly: a front of thousands of trials costs more to validate than to read.
    return Response(json.dumps(document, separators=(",", ":")), media_type="application/json")


def _pareto_dict(
    view: queries.StudyView, front: list[Any], best: int | None, total: int, *, offset: int = 0, stride: int = 1
) -> dict[str, Any]:
    return {
        "objectives": [{"metric": m, "direction": d} for m, d in view.objectives],
        "trials": [trial_dict(t) for t in front],
        "default_pick": best,
        "total": total,
        "offset": offset,
        "stride": stride,
    }


@router.get(
    "/{study_id}/overview",
    response_model=StudyOverview,
    responses={**ERRORS, 200: {"model": StudyOverview, "description": "the study page's first draw"}},
)
def get_overview(
    row: StudyDep,
    db: DBDep,
    status: TrialStatusParam = None,
    sort: SortParam = "number",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    points: Annotated[int | None, Query(ge=10, le=10000)] = None,
    front: Annotated[int | None, Query(ge=1, le=10000)] = None,
) -> Response:
    """The study page's first draw in one request, bounded whatever the study's size: the study, the first
    page of its trial table (as ``/trials``), the front (all of it up to ``FRONT_SAMPLE`` points, else that
    many spread evenly along it: every ``pareto.stride``-th, ``pareto.total`` its size), the plots' points
    (params and metrics, no samples: every trial up to ``queries.MAX_POINTS``, beyond that every
    ``points_stride``-th trial, and the front's points above), the latest 500 failures, and ``seq``: pass
    it to ``/events?after=`` to get what changes next. ``points`` and ``front`` lower (or raise) those two
    bounds: the study page asks for fewer points than the defaults, each costing its first draw time."""
    sort = _checked_sort(db, row, sort)
    seq = queries.last_seq(db, row.id)  # first: what is written meanwhile comes again as a change
    view = queries.study_view(db, row, with_order=True)
    trials, total = queries.trial_page(db, row.id, status=status, sort=sort, limit=limit)
    pareto = _front_sample(db, view, front or FRONT_SAMPLE)
    keep = [t["number"] for t in pareto["trials"]]
    plot, stride = queries.plot_points(db, row.id, view.summary, keep, max_points=points)
    return _json(
        {
            "study": {**view_out(view, detail=True, db=db).model_dump(mode="json"), "note": notes.note(db, row.id)},
            "trials": {"items": [trial_dict(t) for t in trials], "total": total, "limit": limit, "offset": 0},
            "points": plot,
            "points_stride": stride,
            "pareto": pareto,
            "failures": [trial_dict(t) for t in queries.failures(db, row.id)],
            "seq": seq,
        }
    )


@router.get("/{study_id}/importance", response_model=ImportanceOut, responses=ERRORS)
def get_importance(row: StudyDep, db: DBDep) -> ImportanceOut:
    """Parameter importances for the first objective over feasible successful trials (PED-ANOVA)."""
    from api.importance import importances

    return ImportanceOut(importances=importances(db, row))


@router.get(
    "/{study_id}/export",
    response_class=Response,
    responses={
        200: {
            "description": "the export, as a download",
            "content": {t: {"schema": {"type": "string"}} for t in EXPORT_MEDIA_TYPES.values()},
        },
        **ERRORS,
        409: {"model": ErrorOut, "description": "nothing to export yet"},
        422: {
            "model": ErrorOut,
            "description": "invalid input (`detail[].loc` names the field), or a config the format cannot "
            "hold (an env name the shell reads, a NUL): the reason names the param",
        },
    },
)
def export_study(
    row: StudyDep,
    db: DBDep,
    format: Literal["json", "yaml", "env", "python"] = "json",
    trial: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=0, le=10000)] = FRONT_LIMIT,
) -> PlainTextResponse:
    """The chosen config (default pick, or ``?trial=n``) as json/yaml (config, metrics, fingerprint, spec,
    the first ``limit`` trials of the Pareto front, ``pareto_front_total`` its size), env (``KEY=value``
    lines) or python (source to paste). Read from the study's summary and by trial number."""
    try:
        document = export_document(db, row, trial, limit=limit)
        text = render(document, format)
    except ExportRefused as exc:
        raise HTTPException(422, str(exc)) from None
    except ExportError as exc:
        status = 404 if "has no trial" in str(exc) else 409
        raise HTTPException(status, str(exc)) from None
    suffix = {"json": "json", "yaml": "yaml", "env": "env", "python": "py"}[format]
    filename = f"{row.name}-trial{document['trial']}.{suffix}"
    return PlainTextResponse(
        text,
        media_type=EXPORT_MEDIA_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
