"""The regression watch: measure the registry's winners again on this machine's GPU and software.

``recheck`` first marks the GPU's entries measured on other software (driver, CUDA, torch, Triton, NCCL)
``unverified``, then runs each entry's config ``rounds`` times in this process (one trial worker per
workload and args, the same trial template a study runs) and compares the new interval with the stored
one: wholly below it (above, for a figure to minimise) flags the entry ``regressed``, with both figures in
``recheck``; otherwise it is ``ok`` again, verified on the software it ran on now. ``tuner recheck`` runs
it (an operator may schedule that command with cron or CI); ``tuner serve --recheck-every 24h`` has the
runner run it itself, between studies (:mod:`tuner.run.jobs`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from tuner.best_configs import registry as configs
from tuner.best_configs.registry import ConfigEntryRow
from tuner.store.storage import StudyDB, clean_number


@dataclass
class Recheck:
    """One entry's recheck: its verdict (``ok``, ``regressed``, ``skipped``, ``failed``) and the figures."""

    entry_id: int
    verdict: str
    previous: dict[str, Any] | None = None
    interval: dict[str, Any] | None = None
    message: str = ""


def recheck(
    db: StudyDB,
    *,
    workload: str | None = None,
    entry_ids: Iterable[int] | None = None,
    rounds: int = 3,
    args_override: Mapping[str, Any] | None = None,
) -> list[Recheck]:
    """Re-measure this GPU's registry entries (those of ``workload``, or ``entry_ids``) ``rounds`` times each.

    ``args_override``: run-setting args (the workload's ``unkeyed_args``, e.g. ``noop``'s ``drift``) to
    measure with instead of the entry's; an arg that keys entries is refused (ValueError)."""
    run = RecheckRun(db, workload=workload, entry_ids=entry_ids, rounds=rounds, args_override=args_override)
    while run.step() is not None:
        pass
    return run.results


class RecheckRun:
    """One recheck, an entry at a time (:meth:`step`), so that a runner can measure between studies.

    Made, it marks this GPU's entries of other software ``unverified`` and lists the entries to measure."""

    def __init__(
        self,
        db: StudyDB,
        *,
        workload: str | None = None,
        entry_ids: Iterable[int] | None = None,
        rounds: int = 3,
        args_override: Mapping[str, Any] | None = None,
    ) -> None:
        from tuner.workloads.fingerprint import device_info, fingerprint

        self.db, self.rounds, self.override = db, rounds, dict(args_override or {})
        self.current = fingerprint()
        gpu = configs.device_name(device_info().to_dict())
        self.unverified = configs.mark_unverified(db, gpu, self.current)
        query = select(ConfigEntryRow).where(ConfigEntryRow.gpu == gpu).order_by(ConfigEntryRow.id)
        if workload is not None:
            query = query.where(ConfigEntryRow.workload == workload)
        if entry_ids is not None:
            query = query.where(ConfigEntryRow.id.in_(list(entry_ids)))
        with db.Session() as s:
            self.entries = list(s.scalars(query))
        self.results: list[Recheck] = []
        self._workers: dict[str, Any] = {}

    @property
    def done(self) -> bool:
        return len(self.results) >= len(self.entries)

    def step(self) -> Recheck | None:
        """Measure the next entry and store its verdict; None when every entry has been measured."""
        if self.done:
            self._workers.clear()
            return None
        entry = self.entries[len(self.results)]
        result = _recheck_one(self.db, entry, self.entries, self.current, self._workers, self.rounds, self.override)
        self.results.append(result)
        return result


def _recheck_one(
    db: StudyDB,
    entry: ConfigEntryRow,
    entries: list[ConfigEntryRow],
    current: Mapping[str, Any],
    workers: dict[str, Any],
    rounds: int,
    override: dict[str, Any],
) -> Recheck:
    from tuner.workloads.registry import workload_class

    cls = workload_class(entry.workload)
    if cls.multi_gpu:
        return Recheck(entry.id, "skipped", message="a multi-GPU entry is rechecked by a study of its shape")
    key = configs.software_key(current)
    if entry.software_key != key and any(
        e.id != entry.id and e.software_key == key and (e.shape_key, e.fixed_key) == (entry.shape_key, entry.fixed_key)
        for e in entries
    ):
        return Recheck(entry.id, "skipped", message="superseded by an entry measured on this software")
    keyed = sorted(set(override) - set(cls.unkeyed_args))
    if keyed:
        raise ValueError(f"{entry.workload}: {', '.join(keyed)} key entries; only {cls.unkeyed_args} may be set")
    values, errors = _measure(entry, {**entry.args, **override}, workers, rounds)
    if not values:
        return Recheck(entry.id, "failed", entry.interval, None, "; ".join(errors) or "no figure measured")
    new = configs.interval_of(values, entry.objective, "recheck")
    regressed = configs.below(new, entry.interval, entry.direction)
    verdict = "regressed" if regressed else "ok"
    record = {
        "verdict": verdict,
        "interval": new,
        "previous": entry.interval,
        "fingerprint": configs.software(current),
        "checked_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "args_override": override or None,
    }
    values_to_set: dict[str, Any] = {"status": verdict, "recheck": record}
    if not regressed and entry.software_key != key:  # verified on the software it runs on now
        values_to_set.update(fingerprint=configs.software(current), software_key=key)
    with db.Session.begin() as s:
        row = s.get(ConfigEntryRow, entry.id)
        if row is not None:
            for name, value in values_to_set.items():
                setattr(row, name, value)
    return Recheck(entry.id, verdict, entry.interval, new)


def _measure(
    entry: ConfigEntryRow, args: dict[str, Any], workers: dict[str, Any], rounds: int
) -> tuple[list[float], list[str]]:
    """The entry's objective figures of ``rounds`` runs of its config, and the errors of runs that failed."""
    from tuner.run.worker import TrialWorker

    worker_key = configs.canonical([entry.workload, args])
    if worker_key not in workers:
        workers[worker_key] = [TrialWorker(entry.workload, args, "recheck"), 0]
    worker, values, errors = workers[worker_key][0], [], []
    for round_number in range(rounds):
        seq = workers[worker_key][1]
        workers[worker_key][1] += 1
        report = worker.run_trial(dict(entry.config), round_number, 1, seq)
        value = clean_number((report.get("metrics") or {}).get(entry.objective))
        if report.get("status") == "ok" and value is not None:
            values.append(value)
        else:
            errors.append(f"{report.get('status')}: {report.get('error')}")
    return values, errors
