"""The study page's analysis plots, each from one bounded read (``tuner/store/analysis.py``): ``/slice``,
``/contour``, ``/edf``, ``/hypervolume`` and ``/best``. ``limit`` bounds every series; ``color`` (a
categorical knob) groups the points or curves."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from api.deps import DBDep, StudyDep, require_read
from api.routes.studies import ERRORS
from tuner.store import analysis, queries

router = APIRouter(prefix="/api/studies", tags=["analysis"], dependencies=[Depends(require_read)])

NameParam = Annotated[str, Query(max_length=128)]
OptionalName = Annotated[str | None, Query(max_length=128)]
LimitParam = Annotated[int, Query(ge=2, le=5000)]


def _json(document: dict[str, Any]) -> Response:
    return Response(json.dumps(document, separators=(",", ":")), media_type="application/json")


def _unprocessable(field: str, message: str) -> HTTPException:
    return HTTPException(422, [{"loc": ["query", field], "msg": message, "type": "value_error"}])


def _objective(view: queries.StudyView, name: str | None) -> tuple[str, str]:
    if not view.objectives:
        raise _unprocessable("objective", f"the study has no objectives ({view.error or 'unknown'})")
    if name is None:
        return view.objectives[0]
    for metric, direction in view.objectives:
        if metric == name:
            return metric, direction
    raise _unprocessable("objective", f"unknown objective {name!r}; one of {', '.join(m for m, _ in view.objectives)}")


def _checked(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except analysis.AnalysisError as exc:
        raise _unprocessable(exc.field, str(exc)) from None


def _color(row: Any, color: str | None) -> str | None:
    if color:
        _checked(analysis.check_param, row.space, color, "color", categorical=True)
    return color or None


@router.get("/{study_id}/slice", responses=ERRORS)
def get_slice(
    row: StudyDep,
    db: DBDep,
    param: NameParam,
    objective: OptionalName = None,
    color: OptionalName = None,
    limit: LimitParam = 1000,
) -> Response:
    """An objective (default: the first) against one knob's value, numeric or categorical: a point per
    successful trial, every ``stride``-th by number beyond ``limit``; ``group`` is the ``color`` knob's value."""
    spec = _checked(analysis.check_param, row.space, param, "param")
    view = queries.study_view(db, row)
    metric, direction = _objective(view, objective)
    body = analysis.slice_points(db, row.id, view.summary.n_trials, param, metric, _color(row, color), limit)
    kind = "categorical" if analysis.is_categorical(spec) else "numeric"
    return _json(
        {
            "param": param,
            "kind": kind,
            "log": bool(spec.get("log")),
            "objective": metric,
            "direction": direction,
            "color": color or None,
            **body,
        }
    )


@router.get("/{study_id}/contour", responses=ERRORS)
def get_contour(
    row: StudyDep,
    db: DBDep,
    x: NameParam,
    y: NameParam,
    objective: OptionalName = None,
    bins: Annotated[int, Query(ge=2, le=60)] = 20,
    limit: LimitParam = 1000,
) -> Response:
    """The best value of an objective in each cell of a grid over knobs ``x`` and ``y`` (``bins`` cells a
    numeric axis, one a category), every successful trial counted; and up to ``limit`` trials as points."""
    _checked(analysis.check_param, row.space, x, "x")
    _checked(analysis.check_param, row.space, y, "y")
    if x == y:
        raise _unprocessable("y", "x and y must be two different params")
    view = queries.study_view(db, row)
    metric, direction = _objective(view, objective)
    body = analysis.contour_grid(db, row.id, row.space, (x, y), (metric, direction), bins, limit, view.summary.n_trials)
    return _json({"x": x, "y": y, "objective": metric, "direction": direction, **body})


@router.get("/{study_id}/edf", responses=ERRORS)
def get_edf(row: StudyDep, db: DBDep, color: OptionalName = None, limit: LimitParam = 200) -> Response:
    """The empirical distribution of each objective over the successful trials (copies left out): for each
    (and each group of ``color``), values at up to ``limit`` evenly spaced ranks and the fraction at or below."""
    view = queries.study_view(db, row)
    if not view.objectives:
        _objective(view, None)
    curves = analysis.edf_curves(db, row.id, view.objectives, _color(row, color), limit)
    return _json({"color": color or None, "curves": curves})


@router.get("/{study_id}/hypervolume", responses={**ERRORS, 422: {"description": "not two objectives"}})
def get_hypervolume(
    row: StudyDep,
    db: DBDep,
    ref: Annotated[str | None, Query(max_length=200, description="the reference point, comma-separated")] = None,
    limit: LimitParam = 500,
) -> Response:
    """The hypervolume of the feasible front after each trial, for a study of two objectives (an exact
    sweep; more objectives: 422), against ``reference_point`` (``ref=a,b`` in the objectives' units, else the
    worst feasible value of each moved out by a tenth of its range). Only the trials where it grew, thinned
    to ``limit``, and the last one."""
    view = queries.study_view(db, row)
    reference = None
    if ref is not None:
        try:
            reference = [float(v) for v in ref.split(",")]
        except ValueError:
            raise _unprocessable("ref", "ref is comma-separated numbers") from None
        if len(reference) != len(view.objectives):
            raise _unprocessable("ref", f"ref needs {len(view.objectives)} numbers, one per objective")
    return _json(_checked(analysis.hypervolume_history, db, row.id, view.objectives, reference, limit))


@router.get("/{study_id}/best", responses=ERRORS)
def get_best_so_far(row: StudyDep, db: DBDep, limit: LimitParam = 500) -> Response:
    """For each objective, the best feasible value so far against the trial number and against wall time
    (seconds from the first successful trial's start to each finish): the points where it improved."""
    view = queries.study_view(db, row)
    return _json(analysis.best_so_far(db, row.id, view.objectives, limit))
