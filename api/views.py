"""Rows to response models: the one place that turns database rows into what the API shows."""

from __future__ import annotations

import datetime as dt
import math
import re
import site
import sysconfig
from pathlib import Path
from typing import Any

from api.schemas import BestOut, ObjectiveOut, StudyDetail, StudyOut, TrialDetail, TrialOut
from tuner.results.export import TIMING_MEANS
from tuner.store import progress
from tuner.store.queries import StudyView, study_view
from tuner.store.storage import RUNNING, StudyDB, StudyRow, TrialRow, clean_metrics, measured_count
from tuner.workloads.registry import workload_class

#: Folders a trial's traceback names files under, longest first: the project's, and where packages install.
_ROOTS = sorted(
    {
        str(Path(__file__).resolve().parents[1]) + "/",
        *(p.rstrip("/") + "/" for p in site.getsitepackages()),
        *(sysconfig.get_paths()[name].rstrip("/") + "/" for name in ("stdlib", "platstdlib")),
    },
    key=len,
    reverse=True,
)
#: An absolute path: a "/" that starts a word (not inside a URL or a relative path), up to a quote or space.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/[^\s\"':,()\[\]<>]+")


def without_server_paths(text: str | None) -> str | None:
    """A trial's error text as the API serves it: each absolute path the server's own (its folders, Python's)
    made relative to the project or to the packages' folder, any other cut to ``.../file``."""
    if not text:
        return text

    def short(match: re.Match[str]) -> str:
        path = match.group(0)
        for root in _ROOTS:
            if path.startswith(root):
                return path[len(root) :]
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                return path.split(marker, 1)[1]
        return ".../" + path.rsplit("/", 1)[1] if path.count("/") > 1 else path

    return _ABSOLUTE_PATH.sub(short, text)


def _trial_fields(row: TrialRow) -> dict[str, Any]:
    """The fields of ``TrialOut``, times as datetimes."""
    duration = None
    if row.started_at is not None and row.finished_at is not None:
        duration = max(0.0, (row.finished_at - row.started_at).total_seconds())
    return {
        "number": row.number,
        "status": row.status,
        "params": row.params or {},
        "metrics": clean_metrics(row.metrics or {}),
        "feasible": row.feasible,
        "timing_comparable": row.timing_comparable,
        "error": without_server_paths(row.error),
        "worker": row.worker,
        "attempt": row.attempt or 1,
        "duplicate_of": row.duplicate_of,
        "remeasured": row.remeasured,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "duration_s": duration,
    }


def trial_dict(row: TrialRow) -> dict[str, Any]:
    """A trial as ``TrialOut`` serialises it, built without the model (long lists: fronts, overviews)."""
    fields = _trial_fields(row)
    for key in ("started_at", "finished_at"):
        fields[key] = None if fields[key] is None else fields[key].isoformat()
    return fields


def trial_out(row: TrialRow, detail: bool = False) -> TrialOut:
    fields = _trial_fields(row)
    if detail:
        return TrialDetail(
            **fields, samples_ms=list(row.samples_ms or []), fingerprint=row.fingerprint, extra=row.extra or {}
        )
    return TrialOut(**fields)


def study_timing(row: StudyRow) -> dict[str, str] | None:
    """How a kernel workload's trials are timed (its ``timing`` arg, else the workload's default); None for the
    other workloads and for a workload no longer registered."""
    try:
        default = getattr(workload_class(row.workload), "timing", None)
    except Exception:  # an unknown workload: the study is still shown
        return None
    spec = row.spec if isinstance(row.spec, dict) else {}  # a stored spec that is no object shows its error
    args = spec.get("args") if isinstance(spec.get("args"), dict) else {}
    mode = args.get("timing", default)
    if mode not in TIMING_MEANS:
        return None
    return {"mode": mode, "means": TIMING_MEANS[mode]}


def study_out(db: StudyDB, row: StudyRow, detail: bool = False) -> StudyOut:
    """The study as the API shows it, from its summary (no trial is read)."""
    return view_out(study_view(db, row), detail=detail, db=db)


def view_out(view: StudyView, detail: bool = False, db: StudyDB | None = None) -> StudyOut:
    """The study as the API shows it. With ``db``, a running study's ETA uses its recent trial rate (one more
    read); without, its mean rate."""
    row, summary = view.row, view.summary
    counts = {k: v for k, v in summary.counts.items() if v}
    measured = measured_count(counts)
    spec = row.spec if isinstance(row.spec, dict) else {}  # not an object: ``view.error`` says so
    limits = spec.get("budget") if isinstance(spec.get("budget"), dict) else {}
    budget = int(_finite(limits.get("trials")) or 0)
    best = summary.best
    now = dt.datetime.now(dt.timezone.utc)
    elapsed = progress.live_elapsed_s(row.elapsed_s, row.status, row.updated_at, row.lease_expires_at, now)
    eta = None
    if row.status == "running":
        rate = progress.recent_rate(progress.recent_finishes(db, row.id), now) if measured and db else None
        minutes = _finite(limits.get("minutes"))
        eta = progress.eta_s(
            measured=measured, budget_trials=budget, elapsed_s=elapsed, budget_minutes=minutes, rate_per_s=rate
        )
    fields: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "workload": row.workload,
        "status": row.status,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "objectives": [ObjectiveOut(metric=m, direction=d) for m, d in view.objectives],
        "budget_trials": budget,
        "measured": measured,
        "running": counts.get(RUNNING, 0),
        "counts": counts,
        "progress": min(1.0, measured / budget) if budget else 0.0,
        "best": None
        if best is None
        else BestOut(trial=best["trial"], params=best["params"], metrics=clean_metrics(best["metrics"])),
        "front_size": summary.front_size,
        "seq": summary.seq,
        "elapsed_s": elapsed,
        "eta_s": eta,
        "message": row.message,
        "error": view.error,
        "url": f"/api/studies/{row.id}",
        "dashboard_url": f"/studies/{row.id}",
        "proposals": row.proposal_counts,
        "timing": study_timing(row),
    }
    if detail:
        return StudyDetail(
            **fields,
            spec=spec,
            space=row.space if isinstance(row.space, dict) else {},
            space_hash=row.space_hash,
            device=row.device,
            fingerprint=row.fingerprint,
        )
    return StudyOut(**fields)


def _finite(value: Any) -> float | None:
    """A stored number as a float, None for anything else (a NaN or a string written into the database)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
