"""The best-config registry: the winners of studies, kept per (workload, shape, fixed args, GPU, software).

An entry holds a config, the metrics it measured with the winner's interval, its export form (what
``tuner export`` gives, so that a client needs no workload code), and where it came from (study, trial,
measured at). A completed study publishes its pick (``publish: false`` in the spec turns that off);
``tuner publish`` publishes one by hand, ``DELETE /api/configs/{id}`` retracts one.

Entries measured on a CPU or under the Triton interpreter are kept too, keyed by the device ``cpu`` and
marked not comparable: they make the whole path testable without a GPU and are never returned for a GPU
lookup. An entry's ``status`` is ``ok``, ``regressed`` (a recheck measured it below its interval, both
figures kept in ``recheck``) or ``unverified`` (measured on other software than the GPU runs now).

The shape key and the distance between shapes are the workload's (:meth:`tuner.workloads.base.Workload.registry_key`,
:meth:`~tuner.workloads.base.Workload.shape_distance`). Lookups filter by workload and GPU in SQL and rank the few
entries left by distance in Python.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, UniqueConstraint, select, update
from sqlalchemy.orm import Mapped, mapped_column

from tuner.store.storage import Base, StudyDB, StudyRow, TrialRow, UTCDateTime, clean_number

log = logging.getLogger("tuner.best_configs.registry")

STATUSES = ("ok", "regressed", "unverified")
#: The software a timing depends on; a change of any marks the GPU's entries ``unverified``.
SOFTWARE_KEYS = ("driver", "cuda", "torch", "triton", "nccl")
CPU = "cpu"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class ConfigEntryRow(Base):
    """One registry entry. ``shape_key``, ``fixed_key`` and ``software_key`` are canonical texts (sorted
    JSON, a hash) of ``shape``, ``fixed`` and ``fingerprint``, so that the unique key is plain columns."""

    __tablename__ = "tuner_configs"
    __table_args__ = (
        UniqueConstraint("workload", "shape_key", "fixed_key", "gpu", "software_key", name="uq_tuner_configs_key"),
        Index("ix_tuner_configs_lookup", "workload", "gpu", "comparable"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload: Mapped[str] = mapped_column(String(64))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    shape_key: Mapped[str] = mapped_column(String(512))
    fixed: Mapped[dict[str, Any]] = mapped_column(JSON)
    fixed_key: Mapped[str] = mapped_column(String(1024))
    gpu: Mapped[str] = mapped_column(String(128))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)  # SOFTWARE_KEYS' values
    software_key: Mapped[str] = mapped_column(String(64))
    comparable: Mapped[bool] = mapped_column(Boolean)
    args: Mapped[dict[str, Any]] = mapped_column(JSON)  # the study's args, to measure it again
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the params as the study measured them
    exported: Mapped[dict[str, Any]] = mapped_column(JSON)  # the workload's export_config form
    objective: Mapped[str] = mapped_column(String(128))
    direction: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # the objective's figure
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {"metric", "low", "high", "median", "n", "source"}: the winner's interval of the objective
    interval: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="ok", index=True)
    # the last recheck: {"interval", "previous", "fingerprint", "checked_at", "verdict"}
    recheck: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    study_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # provenance, kept if the study goes
    study_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    measured_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


class TrialOriginRow(Base):
    """Where a warm-started trial's config came from (a registry entry at another shape, or a space seed)."""

    __tablename__ = "tuner_trial_origins"

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    # {"source": "registry", "entry": id, "shape": {...}, "distance": d, "value": v} or {"source": "seed"}
    origin: Mapped[dict[str, Any]] = mapped_column(JSON)


class RegistryError(ValueError):
    """A publish or lookup that cannot be done; the message says what is missing."""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def software(fingerprint: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of a trial's fingerprint that keys an entry (``SOFTWARE_KEYS``)."""
    return {key: (fingerprint or {}).get(key) for key in SOFTWARE_KEYS}


def software_key(fingerprint: Mapping[str, Any] | None) -> str:
    return hashlib.sha256(canonical(software(fingerprint)).encode()).hexdigest()[:16]


def device_name(device: Mapping[str, Any] | None) -> str:
    """The GPU's name an entry is keyed by, or ``cpu`` for a run without one."""
    if not device or device.get("kind") != "cuda":
        return CPU
    return str(device.get("name") or CPU)


def metric_interval(
    value: float, metric: str, direction: str, extra: Mapping[str, Any] | None, remeasured: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The interval of a winner's objective: the range of its interleaved re-measurements (with the first
    figure) when it has some, else the timing's 95% interval of the median carried over to the metric (a
    throughput scales as 1/time, a time as time), else the single figure."""
    values = [float(v) for v in (remeasured or {}).get("values") or [] if clean_number(v) is not None]
    if values and (remeasured or {}).get("metric") == metric:
        values.append(value)
        return interval_of(values, metric, "remeasured")
    timing = (extra or {}).get("timing") or {}
    median_ms, ci = clean_number(timing.get("median_ms")), timing.get("ci95_ms")
    if median_ms and isinstance(ci, list) and len(ci) == 2 and all(clean_number(c) for c in ci):
        lo_ms, hi_ms = float(ci[0]), float(ci[1])
        if direction == "maximize":
            bounds = (value * median_ms / hi_ms, value * median_ms / lo_ms)
        else:
            bounds = (value * lo_ms / median_ms, value * hi_ms / median_ms)
        return {
            "metric": metric,
            "low": min(bounds),
            "high": max(bounds),
            "median": value,
            "n": timing.get("reps"),
            "source": "timing",
        }
    return {"metric": metric, "low": value, "high": value, "median": value, "n": 1, "source": "single"}


def interval_of(values: list[float], metric: str, source: str) -> dict[str, Any]:
    """The range and median of several measurements of one metric."""
    return {
        "metric": metric,
        "low": min(values),
        "high": max(values),
        "median": statistics.median(values),
        "n": len(values),
        "source": source,
    }


def below(new: Mapping[str, Any], old: Mapping[str, Any], direction: str) -> bool:
    """Whether interval ``new`` lies wholly on the worse side of ``old`` (no overlap)."""
    if direction == "maximize":
        return float(new["high"]) < float(old["low"])
    return float(new["low"]) > float(old["high"])


def better(a: float | None, b: float | None, direction: str) -> bool:
    """Whether figure ``a`` beats ``b`` (a missing figure never does)."""
    if a is None:
        return False
    if b is None:
        return True
    return a > b if direction == "maximize" else a < b


@dataclass
class Publication:
    """What publishing a study's pick did: the entry, and whether it replaced, kept or added one."""

    entry: ConfigEntryRow | None
    action: str  # "added", "replaced", "kept" (the entry there is better), "none" (nothing to publish)
    message: str = ""
    unverified: list[int] = field(default_factory=list)  # entries marked unverified by this publication
    # a study's pick publishes the best trial of every other registry key it measured (e.g. each precision)
    others: list[Publication] = field(default_factory=list)


def _winner(db: StudyDB, study: StudyRow, trial: int | None) -> TrialRow:
    from tuner.store.queries import kept_results

    if trial is not None:
        row = db.trial(study.id, trial)
        if row is None:
            raise RegistryError(f"study {study.name} has no trial {trial}")
        if row.status != "ok":
            raise RegistryError(f"trial {trial} of study {study.name} is {row.status}, not ok")
        return row
    objectives = [(o["metric"], o["direction"]) for o in (study.objectives or [])]
    if not objectives:
        raise RegistryError(f"study {study.name} has no stored objectives")
    best = kept_results(db, study, limit=0).pick  # the pick the study's summary keeps
    if best is None:
        raise RegistryError(f"study {study.name} has no feasible ok trial to publish")
    return best


def entry_values(study: StudyRow, trial: TrialRow) -> dict[str, Any]:
    """The columns of the entry that publishes ``trial`` of ``study``."""
    from tuner.workloads.registry import workload_class

    cls = workload_class(study.workload)
    args = dict((study.spec or {}).get("args") or {})
    shape, fixed = cls.registry_key(args, trial.params)
    metric, direction = (study.objectives or [{}])[0]["metric"], (study.objectives or [{}])[0]["direction"]
    value = clean_number(trial.metrics.get(metric))
    if value is None:
        raise RegistryError(f"trial {trial.number} of study {study.name} has no figure for {metric}")
    try:
        exported = cls(**args).export_config(dict(trial.params))
    except Exception as exc:  # a workload that cannot be built here (no torch): the raw params stand in
        log.warning("registry: %s's export form not made (%s); the params are published", study.name, exc)
        exported = dict(trial.params)
    gpu = device_name(study.device)
    fingerprint = trial.fingerprint or study.fingerprint or {}
    return {
        "workload": study.workload,
        "shape": shape,
        "shape_key": canonical(shape),
        "fixed": fixed,
        "fixed_key": canonical(fixed),
        "gpu": gpu,
        "fingerprint": software(fingerprint),
        "software_key": software_key(fingerprint),
        "comparable": bool(gpu != CPU and trial.timing_comparable),
        "args": args,
        "config": dict(trial.params),
        "exported": json.loads(canonical(exported)),
        "objective": metric,
        "direction": direction,
        "value": value,
        "metrics": dict(trial.metrics),
        "interval": metric_interval(value, metric, direction, trial.extra, trial.remeasured),
        "status": "ok",
        "recheck": None,
        "study_id": study.id,
        "study_name": study.name,
        "trial_number": trial.number,
        "measured_at": trial.finished_at,
    }


def key_winners(db: StudyDB, study: StudyRow, pick: TrialRow) -> list[TrialRow]:
    """The best trial (:func:`tuner.results.pareto.best_trial` among its own) of each registry key a study measured
    other than its pick's: with ``precision`` a key knob, each precision's winner."""
    from tuner.results.pareto import best_trial
    from tuner.workloads.registry import workload_class

    cls = workload_class(study.workload)
    args = dict((study.spec or {}).get("args") or {})
    objectives = [(o["metric"], o["direction"]) for o in (study.objectives or [])]

    def key_of(row: TrialRow) -> str:
        return canonical(cls.registry_key(args, row.params))

    groups: dict[str, list[TrialRow]] = {}
    for row in db.trials(study.id):
        if row.status == "ok" and row.feasible and row.number != pick.number:
            groups.setdefault(key_of(row), []).append(row)
    groups.pop(key_of(pick), None)
    return [best for rows in groups.values() if (best := best_trial(rows, objectives)) is not None]  # type: ignore[misc]


def publish(db: StudyDB, study_ref: str | int, trial: int | None = None, *, force: bool = True) -> Publication:
    """Publish a study's pick (or trial ``trial``) as the entry of its key; with the pick, the best trial of
    every other key the study measured too (each precision's winner: :func:`key_winners`, in ``others``).

    An entry already there for the key is replaced when ``force`` (a publish by hand) or when the new
    figure is better, or the old entry is not ``ok``; otherwise it is kept. Other entries of the same
    workload and GPU measured on other software become ``unverified``."""
    study = db.find_study(study_ref)
    if study is None:
        raise RegistryError(f"no study named or numbered {study_ref!r}")
    winner = _winner(db, study, trial)
    publication = _publish_trial(db, study, winner, force)
    if trial is None:
        publication.others = [_publish_trial(db, study, other, force) for other in key_winners(db, study, winner)]
    return publication


def _publish_trial(db: StudyDB, study: StudyRow, trial: TrialRow, force: bool) -> Publication:
    values = entry_values(study, trial)
    key = {k: values[k] for k in ("workload", "shape_key", "fixed_key", "gpu", "software_key")}
    with db.Session.begin() as s:
        row = s.scalar(select(ConfigEntryRow).where(*[getattr(ConfigEntryRow, k) == v for k, v in key.items()]))
        if row is None:
            row, action = ConfigEntryRow(**values), "added"
            s.add(row)
        elif force or row.status != "ok" or better(values["value"], row.value, values["direction"]):
            for name, value in values.items():
                setattr(row, name, value)
            action = "replaced"
        else:
            action = "kept"
        s.flush()
        marked = _mark_unverified(s, values["workload"], values["gpu"], values["software_key"])
    message = f"{action} entry {row.id} ({row.workload} {row.shape_key} on {row.gpu}) from {study.name}"
    return Publication(row, action, message, marked)


def publish_completed(db: StudyDB, study_id: int) -> Publication:
    """The automatic publication at the end of a completed study (unless its spec says ``publish: false``);
    never raises: a study without a feasible trial publishes nothing and says why."""
    study = db.get_study(study_id)
    if study is None or not (study.spec or {}).get("publish", True):
        return Publication(None, "none", "publish is off")
    try:
        return publish(db, study_id, force=False)
    except Exception as exc:  # a failed publication never fails the study that finished
        log.warning("registry: study %s not published: %s", study.name, exc)
        return Publication(None, "none", str(exc))


def _mark_unverified(session: Any, workload: str | None, gpu: str, current_software: str) -> list[int]:
    query = select(ConfigEntryRow.id).where(
        ConfigEntryRow.gpu == gpu, ConfigEntryRow.software_key != current_software, ConfigEntryRow.status == "ok"
    )
    if workload is not None:
        query = query.where(ConfigEntryRow.workload == workload)
    ids = list(session.scalars(query))
    if ids:
        session.execute(update(ConfigEntryRow).where(ConfigEntryRow.id.in_(ids)).values(status="unverified"))
    return ids


def mark_unverified(db: StudyDB, gpu: str, fingerprint: Mapping[str, Any]) -> list[int]:
    """Entries of ``gpu`` measured on other software than ``fingerprint``'s become ``unverified``; their ids."""
    with db.Session.begin() as s:
        return _mark_unverified(s, None, gpu, software_key(fingerprint))


def retract(db: StudyDB, entry_id: int) -> bool:
    """Delete an entry; False when there is none of that id."""
    with db.Session.begin() as s:
        row = s.get(ConfigEntryRow, entry_id)
        if row is None:
            return False
        s.delete(row)
    return True


def get_entry(db: StudyDB, entry_id: int) -> ConfigEntryRow | None:
    with db.Session() as s:
        return s.get(ConfigEntryRow, entry_id)


def list_entries(
    db: StudyDB,
    *,
    workload: str | None = None,
    gpu: str | None = None,
    status: str | None = None,
    shape: Mapping[str, Any] | None = None,
    limit: int = 200,
    offset: int = 0,
) -> tuple[int, list[ConfigEntryRow]]:
    """``(total, page)`` of entries, newest first; ``shape`` keeps those whose shape has these values."""
    from sqlalchemy import func

    query = select(ConfigEntryRow)
    for column, value in (
        (ConfigEntryRow.workload, workload),
        (ConfigEntryRow.gpu, gpu),
        (ConfigEntryRow.status, status),
    ):
        if value:
            query = query.where(column == value)
    with db.Session() as s:
        if not shape:
            total = s.scalar(select(func.count()).select_from(query.subquery())) or 0
            page = s.scalars(query.order_by(ConfigEntryRow.id.desc()).offset(offset).limit(limit))
            return total, list(page)
        # shape values are JSON: matched here, on the workload's (or GPU's) entries only
        rows = [r for r in s.scalars(query.order_by(ConfigEntryRow.id.desc())) if _shape_matches(r.shape, shape)]
    return len(rows), rows[offset : offset + limit]


def _shape_matches(shape: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(name in shape and same_value(shape[name], value) for name, value in wanted.items())


def same_value(stored: Any, asked: Any) -> bool:
    """Whether a stored value equals one asked for (a query string's ``8192`` or ``true`` included)."""
    if stored == asked:
        return True
    return canonical(stored) == canonical(parse_value(asked)) if isinstance(asked, str) else False


def parse_value(text: Any) -> Any:
    """A query parameter as the value it spells: an int, a float, a bool, null, else the text."""
    if not isinstance(text, str):
        return text
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if kind is int or math.isfinite(number) else text
    return text


@dataclass
class Match:
    """An entry a lookup found, and how far its shape is from the one asked for (0: the same)."""

    entry: ConfigEntryRow
    distance: float


@dataclass
class Lookup:
    """A lookup's answer: ``exact`` when the first match has the shape asked for."""

    exact: bool
    matches: list[Match]


STATUS_RANK = {"ok": 0, "unverified": 1, "regressed": 2}


def lookup(
    db: StudyDB,
    workload: str,
    shape: Mapping[str, Any],
    *,
    gpu: str | None = None,
    fixed: Mapping[str, Any] | None = None,
    k: int = 1,
) -> Lookup:
    """The entry of exactly ``shape`` (``exact``), else the ``k`` nearest within the workload's bound.

    ``gpu``: that device's entries only (None: any GPU). Entries measured on a CPU or under the
    interpreter are returned only for ``gpu="cpu"``. ``fixed``: fixed args the entry must have (e.g.
    ``precision``). Among entries of one shape, ``ok`` ones come first, then the newest. Raises
    :class:`RegistryError` naming what is missing: a shape arg, or any entry near enough."""
    from tuner.workloads.registry import workload_class

    cls = workload_class(workload)
    missing = [name for name in cls.shape_args if name not in shape]
    if missing:
        raise RegistryError(
            f"{workload}'s shape needs {', '.join(missing)} (its shape args: {', '.join(cls.shape_args) or 'none'})"
        )
    asked = {name: parse_value(shape[name]) for name in cls.shape_args}
    query = select(ConfigEntryRow).where(ConfigEntryRow.workload == workload)
    if gpu is not None and gpu.lower() == CPU:
        query = query.where(ConfigEntryRow.gpu == CPU)
    else:
        query = query.where(ConfigEntryRow.comparable.is_(True))
        if gpu is not None:
            query = query.where(ConfigEntryRow.gpu == gpu)
    with db.Session() as s:
        rows = list(s.scalars(query))
    matches = []
    for row in rows:
        if fixed and not _shape_matches(row.fixed, fixed):
            continue
        distance = 0.0 if _shape_matches(row.shape, asked) else cls.shape_distance(asked, row.shape)
        if distance is not None:
            matches.append(Match(row, distance))
    matches.sort(key=lambda m: (m.distance, STATUS_RANK.get(m.entry.status, 3), -_stamp(m.entry), m.entry.id))
    # one entry per (shape, fixed args); of one shape's fixed args (each precision a study published) the
    # best figure first: a lookup that names no precision gets the study's pick
    matches = sorted(_one_per_shape(matches), key=lambda m: (m.distance, STATUS_RANK.get(m.entry.status, 3), _rank(m)))
    matches = matches[: max(1, k)]
    if not matches:
        where = f" on {gpu}" if gpu else " on any GPU"
        wanted = ", ".join(f"{n}={v}" for n, v in asked.items())
        extra = f" with {canonical(dict(fixed))}" if fixed else ""
        raise RegistryError(
            f"no {workload} entry{extra}{where} at or near {wanted or 'its shape'} "
            f"(within distance {cls.max_shape_distance:g}): publish a study of that shape"
        )
    return Lookup(exact=matches[0].distance == 0.0, matches=matches)


def _one_per_shape(matches: list[Match]) -> list[Match]:
    """The best-ranked entry of each (shape, fixed args): older software's entries stand behind it."""
    seen: set[tuple[str, str]] = set()
    out = []
    for match in matches:
        key = (match.entry.shape_key, match.entry.fixed_key)
        if key not in seen:
            seen.add(key)
            out.append(match)
    return out


def _rank(match: Match) -> float:
    """An entry's figure as a sort key (best first; none last)."""
    value = match.entry.value
    if value is None or not math.isfinite(value):
        return math.inf
    return -value if match.entry.direction == "maximize" else value


def _stamp(entry: ConfigEntryRow) -> float:
    return (entry.measured_at or entry.created_at or _now()).timestamp()


# warm-start origins ------------------------------------------------------------
def record_origins(db: StudyDB, study_id: int, origins: Mapping[int, Mapping[str, Any]]) -> None:
    """Store where trials' configs came from (warm start), replacing what was stored for those numbers."""
    if not origins:
        return
    with db.Session.begin() as s:
        for number, origin in origins.items():
            s.merge(TrialOriginRow(study_id=study_id, number=int(number), origin=dict(origin)))


def trial_origins(db: StudyDB, study_id: int) -> dict[int, dict[str, Any]]:
    """Trial number -> origin of a study's warm-started trials (the others came from the search)."""
    with db.Session() as s:
        rows = s.scalars(select(TrialOriginRow).where(TrialOriginRow.study_id == study_id))
        return {row.number: row.origin for row in rows}


def retune_spec(db: StudyDB, entry: ConfigEntryRow) -> dict[str, Any]:
    """The spec of a study that tunes an entry's shape again: its study's spec when the study is still
    there (else one built from the entry), renamed, warm-started from the registry and published."""
    study = db.get_study(entry.study_id) if entry.study_id is not None else None
    if study is not None and study.spec:
        spec = dict(study.spec)
    else:
        spec = {
            "workload": entry.workload,
            "args": dict(entry.args),
            "objectives": [{"metric": entry.objective, "direction": entry.direction}],
        }
    stamp = _now().strftime("%Y%m%d-%H%M%S")
    base = (entry.study_name or entry.workload)[:90]
    spec.update(name=f"{base}-retune-{entry.id}-{stamp}", warm_start="registry", publish=True)
    return spec
