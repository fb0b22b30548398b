"""The registry's answers as the API and the client read them: an entry's JSON (its config as the call that uses
it takes it: ``function`` and ``kwargs``, beside the params measured) and a lookup's."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from tuner.best_configs.registry import ConfigEntryRow, Lookup, canonical

log = logging.getLogger("tuner.best_configs.registry")


def launch_call(entry: ConfigEntryRow) -> dict[str, Any]:
    """The entry's config as the call that uses it takes it (:meth:`tuner.workloads.base.Workload.launch_call`):
    ``function`` (a dotted name, or None) and ``kwargs``. A workload that cannot be built here gives the
    export form's ``function`` and its ``kwargs`` (the form as it is when it has none)."""
    try:
        call = _workload(entry.workload, canonical(entry.args)).launch_call(dict(entry.config))
    except Exception as exc:  # an unknown workload, or args this version refuses: the stored form stands in
        log.debug("registry: entry %s's call from its export form (%s)", entry.id, exc)
        exported = entry.exported or {}
        call = {"function": exported.get("function"), "kwargs": dict(exported.get("kwargs", exported))}
    return json.loads(canonical(call))


@functools.lru_cache(maxsize=64)
def _workload(name: str, args: str) -> Any:
    """The workload an entry was measured with (a page of entries builds each once; none measures here)."""
    from tuner.workloads.registry import workload_class

    return workload_class(name)(**json.loads(args))


def entry_dict(entry: ConfigEntryRow, distance: float | None = None) -> dict[str, Any]:
    """An entry as the API and the client read it (JSON types only): ``function`` and ``kwargs`` are the
    call that uses the config (``fn(a, b, **kwargs)``), ``params`` (also ``config``) the params measured."""
    call = launch_call(entry)
    out = {
        "function": call["function"],
        "kwargs": call["kwargs"],
        "params": entry.config,
        "id": entry.id,
        "workload": entry.workload,
        "shape": entry.shape,
        "fixed": entry.fixed,
        "gpu": entry.gpu,
        "comparable": entry.comparable,
        "fingerprint": entry.fingerprint,
        "config": entry.config,
        "exported": entry.exported,
        "objective": entry.objective,
        "direction": entry.direction,
        "value": entry.value,
        "metrics": entry.metrics,
        "interval": entry.interval,
        "status": entry.status,
        "recheck": entry.recheck,
        "study_id": entry.study_id,
        "study": entry.study_name,
        "trial": entry.trial_number,
        "measured_at": entry.measured_at.isoformat() if entry.measured_at else None,
        "updated_at": entry.updated_at.isoformat() if entry.updated_at else None,
    }
    if distance is not None:
        out["distance"] = distance
    return out


def lookup_dict(result: Lookup) -> dict[str, Any]:
    """``GET /api/configs``' answer: ``exact``, the best entry's fields and every match with its distance."""
    best = result.matches[0]
    return {
        "exact": result.exact,
        **entry_dict(best.entry, best.distance),
        "matches": [entry_dict(m.entry, m.distance) for m in result.matches],
    }
