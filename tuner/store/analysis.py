"""What the study page's analysis plots draw, computed in the database and bounded whatever the study's size:
slice (an objective against one knob), contour (an objective over two knobs, binned), the empirical
distribution of each objective, the hypervolume of the front after each trial, and the best value so far by
trial number and by wall time.

Every read is of successful original trials (status ``ok``, copies left out): one indexed query that joins
the trial rows to their metric values (``tuner_trial_values``, finite values only) and extracts only the
knobs asked for from the params JSON. Long series are cut to about ``limit`` points: every ``stride``-th
trial (slice, contour points), evenly spaced quantiles (EDF), or only the trials where the curve moves
(best so far, hypervolume), each thinned further to ``limit``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import aliased

from tuner.store.storage import StudyDB, TrialRow, TrialValueRow

OK = "ok"


class AnalysisError(ValueError):
    """A request the study cannot answer (unknown knob or objective, too many objectives): a 422."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def space_params(space: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The study's knobs by name, as its canonical space lists them."""
    return dict((space or {}).get("params") or {})


def is_categorical(spec: dict[str, Any]) -> bool:
    return spec.get("type") == "categorical" or "choices" in spec


def check_param(space: dict[str, Any] | None, name: str, field: str, *, categorical: bool = False) -> dict[str, Any]:
    """The knob's canonical spec, or an :class:`AnalysisError` naming the known ones."""
    params = space_params(space)
    if name not in params:
        raise AnalysisError(field, f"unknown param {name!r}; one of {', '.join(params) or '(none)'}")
    if categorical and not is_categorical(params[name]):
        raise AnalysisError(field, f"{name!r} is not a categorical param; colour by one with choices")
    return params[name]


def rows(
    db: StudyDB,
    study_id: int,
    metrics: Sequence[str],
    params: Sequence[str] = (),
    *,
    times: bool = False,
    stride: int = 1,
) -> list[tuple[Any, ...]]:
    """``(number, feasible, [started_at, finished_at,] *params, *metrics)`` of the study's successful original
    trials that have every metric, in number order; ``stride``: every ``stride``-th trial by number only."""
    values = [aliased(TrialValueRow) for _ in metrics]
    columns: list[Any] = [TrialRow.number, TrialRow.feasible]
    if times:
        columns += [TrialRow.started_at, TrialRow.finished_at]
    if params:  # the whole column, decoded here: SQLite's JSON extraction rounds floats to 15 digits
        columns.append(TrialRow.params)
    columns += [v.value for v in values]
    query = select(*columns).where(
        TrialRow.study_id == study_id, TrialRow.status == OK, TrialRow.duplicate_of.is_(None)
    )
    for value, metric in zip(values, metrics, strict=True):
        query = query.join(
            value,
            and_(value.study_id == TrialRow.study_id, value.number == TrialRow.number, value.metric == metric),
        )
    if stride > 1:
        query = query.where(TrialRow.number % stride == 0)
    head = len(columns) - len(values) - (1 if params else 0)
    with db.engine.connect() as conn:
        found = conn.execute(query.order_by(TrialRow.number))
        if not params:
            return [tuple(r) for r in found]
        return [(*r[:head], *((r[head] or {}).get(p) for p in params), *r[head + 1 :]) for r in found]


def stride_for(n_trials: int, limit: int) -> int:
    return max(1, -(-n_trials // max(1, limit)))


def group_of(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------- slice and contour
def slice_points(
    db: StudyDB, study_id: int, n_trials: int, param: str, objective: str, color: str | None, limit: int
) -> dict[str, Any]:
    """The objective against ``param``'s value, a point a trial (every ``stride``-th past ``limit``)."""
    stride = stride_for(n_trials, limit)
    knobs = [param] + ([color] if color else [])
    found = rows(db, study_id, [objective], knobs, stride=stride)
    points = []
    for r in found:
        point = {"number": r[0], "feasible": r[1], "value": r[2], "objective": r[-1]}
        if color:
            point["group"] = group_of(r[3])
        points.append(point)
    return {"points": points, "stride": stride}


def _bins(values: list[Any], spec: dict[str, Any], n_bins: int) -> tuple[list[Any], Any]:
    """The axis' cells (categories, or bin centres of equal width, in log space for a log knob) and a function
    from a value to its cell's index (None outside)."""
    if is_categorical(spec):
        cells = [str(c) for c in spec.get("choices") or sorted({str(v) for v in values})]
        index = {c: i for i, c in enumerate(cells)}
        return cells, lambda v: index.get(str(v))
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    log = bool(spec.get("log")) and all(v > 0 for v in numbers)
    warp = math.log if log else float
    low = warp(float(spec["low"])) if spec.get("low") is not None else min(map(warp, numbers), default=0.0)
    high = warp(float(spec["high"])) if spec.get("high") is not None else max(map(warp, numbers), default=1.0)
    width = (high - low) / n_bins if high > low else 1.0
    cells = [(math.exp if log else float)(low + (i + 0.5) * width) for i in range(n_bins)]

    def cell(v: Any) -> int | None:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or (log and v <= 0):
            return None
        return min(n_bins - 1, max(0, int((warp(float(v)) - low) / width)))

    return cells, cell


def contour_grid(
    db: StudyDB,
    study_id: int,
    space: dict[str, Any] | None,
    axes: tuple[str, str],
    objective: tuple[str, str],
    n_bins: int,
    limit: int,
    n_trials: int,
) -> dict[str, Any]:
    """The best objective value in each cell of a grid over two knobs (every trial counted), and up to about
    ``limit`` of the trials as points (every ``stride``-th)."""
    x, y = axes
    metric, direction = objective
    found = rows(db, study_id, [metric], [x, y])
    params = space_params(space)
    xs, x_cell = _bins([r[2] for r in found], params[x], n_bins)
    ys, y_cell = _bins([r[3] for r in found], params[y], n_bins)
    better = max if direction == "maximize" else min
    z: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    for _, _, xv, yv, value in found:
        i, j = y_cell(yv), x_cell(xv)
        if i is not None and j is not None:
            z[i][j] = value if z[i][j] is None else better(z[i][j], value)
    stride = stride_for(len(found), limit)
    points = [{"number": r[0], "x": r[2], "y": r[3], "objective": r[4]} for r in found[::stride]]
    return {"x_cells": xs, "y_cells": ys, "z": z, "points": points, "stride": stride, "count": len(found)}


# ---------------------------------------------------------------- EDF
def edf_curves(
    db: StudyDB, study_id: int, objectives: Sequence[tuple[str, str]], color: str | None, limit: int
) -> list[dict[str, Any]]:
    """For each objective (and each group of ``color``): the sorted values at up to ``limit`` evenly spaced
    ranks and the fraction of trials at or below each, both ends kept."""
    curves = []
    for metric, direction in objectives:
        found = rows(db, study_id, [metric], [color] if color else [])
        groups: dict[str | None, list[float]] = {}
        for r in found:
            groups.setdefault(group_of(r[2]) if color else None, []).append(float(r[-1]))
        for group, values in sorted(groups.items(), key=lambda kv: str(kv[0])):
            values.sort()
            n = len(values)
            ranks = _spread(n, limit)
            curve = {"metric": metric, "direction": direction, "count": n}
            curve.update(values=[values[i] for i in ranks], fraction=[(i + 1) / n for i in ranks])
            if color:
                curve["group"] = group
            curves.append(curve)
    return curves


def _spread(n: int, limit: int) -> list[int]:
    """Up to ``limit`` indices of ``range(n)`` spread evenly, first and last kept."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / max(1, limit - 1)
    return sorted({round(i * step) for i in range(limit)} | {n - 1})


def thin(points: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """``points`` cut to about ``limit``, evenly by position, first and last kept."""
    return points if len(points) <= limit else [points[i] for i in _spread(len(points), limit)]


# ---------------------------------------------------------------- best so far
def best_so_far(db: StudyDB, study_id: int, objectives: Sequence[tuple[str, str]], limit: int) -> dict[str, Any]:
    """For each objective, the best feasible value so far: by trial number (a point at each trial that
    improved it, and the last trial) and by wall time (seconds from the study's first trial start to each
    improving trial's finish, in finish order)."""
    out = []
    for metric, direction in objectives:
        found = [r for r in rows(db, study_id, [metric], times=True) if r[1]]
        sign = -1.0 if direction == "maximize" else 1.0
        by_trial = _improvements([(r[0], r[0], r[4]) for r in found], sign)
        if found and (not by_trial or by_trial[-1]["number"] != found[-1][0]):
            by_trial.append({"number": found[-1][0], "x": found[-1][0], "best": by_trial[-1]["best"]})
        starts = [r[2] for r in found if r[2] is not None]
        origin = min(starts) if starts else None
        timed = sorted((r for r in found if r[3] is not None and origin is not None), key=lambda r: (r[3], r[0]))
        by_time = _improvements([(r[0], (r[3] - origin).total_seconds(), r[4]) for r in timed], sign)
        out.append(
            {
                "metric": metric,
                "direction": direction,
                "by_trial": thin(by_trial, limit),
                "by_time": thin(by_time, limit),
                "count": len(found),
            }
        )
    return {"objectives": out}


def _improvements(series: list[tuple[int, float, float]], sign: float) -> list[dict[str, Any]]:
    best: float | None = None
    out = []
    for number, x, value in series:
        if best is None or sign * value < sign * best:
            best = value
            out.append({"number": number, "x": x, "best": value})
    return out


# ---------------------------------------------------------------- hypervolume
def hypervolume_history(
    db: StudyDB, study_id: int, objectives: Sequence[tuple[str, str]], reference: Sequence[float] | None, limit: int
) -> dict[str, Any]:
    """The hypervolume of the feasible front after each trial (two objectives: an exact sweep, updated as each
    trial enters the front) against ``reference`` (the objectives' own units; default: the worst value of
    each over the feasible trials, moved out by a tenth of its range). Points where it grew, thinned to
    ``limit``, and the last trial."""
    if len(objectives) != 2:
        raise AnalysisError("objectives", f"hypervolume history needs two objectives; this study has {len(objectives)}")
    metrics = [m for m, _ in objectives]
    signs = [-1.0 if d == "maximize" else 1.0 for _, d in objectives]
    found = [r for r in rows(db, study_id, metrics) if r[1]]
    keys = [(r[0], signs[0] * r[2], signs[1] * r[3]) for r in found]
    if reference is None:
        ref = [_worst([k[i + 1] for k in keys]) for i in range(2)]
    else:
        ref = [signs[i] * float(reference[i]) for i in range(2)]
    history, front, volume = [], _Front2D(), 0.0
    for number, a, b in keys:
        if a < ref[0] and b < ref[1] and front.add(a, b):
            volume = front.volume(ref)
            history.append({"number": number, "hypervolume": volume})
    if keys and (not history or history[-1]["number"] != keys[-1][0]):
        history.append({"number": keys[-1][0], "hypervolume": volume})
    return {
        "objectives": [{"metric": m, "direction": d} for m, d in objectives],
        "reference_point": {m: signs[i] * ref[i] for i, m in enumerate(metrics)},
        "history": thin(history, limit),
        "hypervolume": volume,
        "count": len(keys),
    }


def _worst(values: list[float]) -> float:
    if not values:
        return 1.0
    high, low = max(values), min(values)
    return high + (0.1 * (high - low) if high > low else max(abs(high) * 0.1, 1e-12))


class _Front2D:
    """A two-objective front of "smaller is better" points, kept sorted by the first (and so descending in the
    second); its hypervolume is a sweep over it."""

    def __init__(self) -> None:
        self.a: list[float] = []
        self.b: list[float] = []

    def add(self, a: float, b: float) -> bool:
        """Fold a point in; False when a front point dominates or equals it."""
        i = bisect.bisect_left(self.a, a)
        if (i > 0 and self.b[i - 1] <= b) or (i < len(self.a) and self.a[i] == a and self.b[i] <= b):
            return False  # a point no worse in both
        j = i
        while j < len(self.a) and self.b[j] >= b:
            j += 1  # points no better in either: dominated by the new one
        self.a[i:j], self.b[i:j] = [a], [b]
        return True

    def volume(self, ref: Sequence[float]) -> float:
        total, ceiling = 0.0, ref[1]
        for a, b in zip(self.a, self.b, strict=True):
            total += (ref[0] - a) * (ceiling - b)
            ceiling = b
        return total
