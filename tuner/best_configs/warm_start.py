"""How a study starts: which warm start it takes, the registry's configs it enqueues and the priors it reads.

``warm_start`` in a spec: ``false`` (nothing first), ``true`` (the space's seeds first), ``registry`` (the
configs of the registry's entries at the ``warm_start_k`` nearest shapes, then the seeds) or ``auto``, the
default: ``registry`` when the registry has a comparable entry near the study's shape, else the seeds.
Comparable: the same workload and fixed args, on the study's device (the same GPU; a study on a CPU reads
the ``cpu`` entries, a GPU study never does), within the workload's ``max_shape_distance``.

With the registry, the strategy also gets *priors*: what those entries' configs measured at their shapes.
When an entry's study is still in the database that is its trials (up to :data:`MAX_SOURCE_TRIALS`: the
``ok`` ones, and the failures whose cause does not depend on the shape, :data:`TRANSFERABLE_FAILURES`),
else the entry's own config and figures. The project's strategy (``sampler: auto``) reads them as
down-weighted observations (:mod:`tuner.strategy.priors`); Optuna's samplers cannot take observations that
are not trials of their study, so for them the enqueued configs are all the registry gives.

The decision, why it was taken, the enqueued configs and the priors are stored with the study at its first
start (:class:`WarmStartRow`); a resumed study reads them back instead of asking the registry again, so it
proposes what an uninterrupted run would have, whatever was published meanwhile.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, ForeignKey, select
from sqlalchemy.orm import Mapped, mapped_column

from tuner.best_configs import registry as configs
from tuner.store.storage import Base, StudyDB, TrialRow, UTCDateTime
from tuner.study.sampler_registry import sampler_info

log = logging.getLogger("tuner.best_configs.warm_start")

MAX_SOURCE_TRIALS = 400  # trials read from each entry's study as priors
#: Failures that say something about a config whatever the shape: it does not compile, or its tiles do not
#: fit the device's shared memory or registers. (A timeout, an OOM or wrong numerics may well be the shape's.)
TRANSFERABLE_FAILURES = ("compile_error", "out_of_resources")
MODES = ("registry", "seeds", "off")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class WarmStartRow(Base):
    """How a study started (written at its first start, read back on resume)."""

    __tablename__ = "tuner_warm_starts"

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    # {"requested": the spec's value, "mode": registry | seeds | off, "reason": why, "entries": [ids],
    #  "priors": how many, "priors_note": what the strategy made of them}
    decision: Mapped[dict[str, Any]] = mapped_column(JSON)
    configs: Mapped[list[Any]] = mapped_column(JSON)  # [[config, origin], ...] enqueued before the seeds
    priors: Mapped[list[Any]] = mapped_column(JSON)  # [{"config", "status", "metrics", "source", "distance"}]
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now)


@dataclass
class WarmStart:
    """A study's warm start: the decision (``mode`` and why), the configs to enqueue first and the priors."""

    requested: Any
    mode: str
    reason: str
    configs: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    priors: list[dict[str, Any]] = field(default_factory=list)
    priors_note: str | None = None

    def decision(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "mode": self.mode,
            "reason": self.reason,
            "entries": [origin.get("entry") for _, origin in self.configs if origin.get("entry") is not None],
            "priors": len(self.priors),
            "priors_note": self.priors_note,
        }


def plan(db: StudyDB, compiled: Any, device: Mapping[str, Any], study_id: int, *, fresh: bool) -> WarmStart:
    """The study's warm start: the stored one when the study started before, else decided now (not stored:
    :func:`save` does that once the sampler has read it). ``fresh``: the study has no trial yet; a study with
    trials but no stored warm start (one begun before warm starts were stored) takes no registry configs."""
    stored = load(db, study_id)
    if stored is not None:
        return stored
    spec = compiled.spec
    requested = spec.warm_start
    if not fresh:
        mode = "seeds" if requested else "off"
        return WarmStart(requested, mode, "resumed a study begun before warm starts were stored: the seeds left")
    if sampler_info(spec.sampler).enumerates:
        return WarmStart(
            requested, "off", f"the {spec.sampler} sampler visits its grid in its own order: no warm start"
        )
    if requested is False:
        return WarmStart(requested, "off", "warm_start: false")
    if requested is True:
        return WarmStart(requested, "seeds", "warm_start: true: the space's seed configs first")
    matches, missing = nearest(db, compiled, device, spec.warm_start_k)
    if requested == "registry":
        if not matches:
            return WarmStart(requested, "registry", f"warm_start: registry, but {missing}; the space's seeds only")
        reason = f"warm_start: registry: {_found(matches)}"
    elif not matches:
        return WarmStart(requested, "seeds", f"default (auto): {missing}; the space's seed configs first")
    else:
        reason = f"default (auto): {_found(matches)}"
    priors = registry_priors(db, matches) if spec.warm_start_priors else []
    note = None if spec.warm_start_priors else "no priors: warm_start_priors is false"
    return WarmStart(requested, "registry", reason, [_enqueued(m) for m in matches], priors, note)


def _found(matches: list[configs.Match]) -> str:
    nearest_one = matches[0]
    return (
        f"{len(matches)} comparable registry entr{'y' if len(matches) == 1 else 'ies'} near this shape "
        f"(nearest: {configs.canonical(nearest_one.entry.shape)} on {nearest_one.entry.gpu}, distance "
        f"{nearest_one.distance:.3g}); their configs first, then the space's seeds"
    )


def nearest(db: StudyDB, compiled: Any, device: Mapping[str, Any], k: int) -> tuple[list[configs.Match], str]:
    """The registry's entries at the ``k`` nearest shapes comparable with the study (its workload, fixed args
    and device), nearest first, and when there are none, why."""
    cls = compiled.workload_cls
    shape, fixed = cls.registry_key(dict(compiled.spec.args), {})
    try:
        found = configs.lookup(db, cls.name, shape, gpu=configs.device_name(device), fixed=fixed, k=k)
    except configs.RegistryError as exc:
        return [], str(exc)
    return found.matches, ""


def _enqueued(match: configs.Match) -> tuple[dict[str, Any], dict[str, Any]]:
    entry = match.entry
    origin = {
        "source": "registry",
        "entry": entry.id,
        "shape": entry.shape,
        "distance": match.distance,
        "objective": entry.objective,
        "value": entry.value,
        "study": entry.study_name,
    }
    return dict(entry.config), origin


def warm_start_configs(
    db: StudyDB, compiled: Any, device: Mapping[str, Any], k: int
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(config, origin) of the registry's entries at the ``k`` nearest shapes, nearest first (none when the
    registry has none comparable)."""
    matches, missing = nearest(db, compiled, device, k)
    if not matches:
        log.info("warm start from the registry: %s", missing)
    return [_enqueued(m) for m in matches]


def registry_priors(db: StudyDB, matches: list[configs.Match]) -> list[dict[str, Any]]:
    """What the matched entries' configs measured at their shapes: each entry's study's trials when the study
    is still there (the ``ok`` ones and the :data:`TRANSFERABLE_FAILURES`), else the entry itself. One
    ``source`` per entry: figures are compared within a source only."""
    out: list[dict[str, Any]] = []
    for match in matches:
        entry = match.entry
        source = f"entry {entry.id}: {entry.workload} {configs.canonical(entry.shape)} on {entry.gpu}"
        study = db.get_study(entry.study_id) if entry.study_id is not None else None
        rows = _source_trials(db, study.id) if study is not None and study.workload == entry.workload else []
        if not rows:
            rows = [(dict(entry.config), "ok", dict(entry.metrics))]
        out += [
            {"config": config, "status": status, "metrics": metrics, "source": source, "distance": match.distance}
            for config, status, metrics in rows
        ]
    return out


def _source_trials(db: StudyDB, study_id: int) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    statuses = ("ok", *TRANSFERABLE_FAILURES)
    query = (
        select(TrialRow.params, TrialRow.status, TrialRow.metrics)
        .where(TrialRow.study_id == study_id, TrialRow.status.in_(statuses), TrialRow.duplicate_of.is_(None))
        .order_by(TrialRow.number)
        .limit(MAX_SOURCE_TRIALS)
    )
    with db.Session() as s:
        return [(dict(p), str(st), dict(m or {})) for p, st, m in s.execute(query)]


def save(db: StudyDB, study_id: int, start: WarmStart) -> None:
    """Store (or update) a study's warm start."""
    with db.Session.begin() as s:
        s.merge(
            WarmStartRow(
                study_id=study_id,
                decision=start.decision(),
                configs=[[config, origin] for config, origin in start.configs],
                priors=list(start.priors),
            )
        )


def load(db: StudyDB, study_id: int) -> WarmStart | None:
    """A study's stored warm start, or None before its first start (or for a study older than this table)."""
    with db.Session() as s:
        row = s.get(WarmStartRow, study_id)
        if row is None:
            return None
        decision = dict(row.decision)
        pairs = [(dict(config), dict(origin)) for config, origin in row.configs]
        return WarmStart(
            decision.get("requested"),
            str(decision.get("mode")),
            str(decision.get("reason")),
            pairs,
            list(row.priors),
            decision.get("priors_note"),
        )


def decision_of(db: StudyDB, study_id: int) -> dict[str, Any] | None:
    """What the study page shows: the stored decision (without the priors' rows), or None."""
    start = load(db, study_id)
    return start.decision() if start is not None else None
