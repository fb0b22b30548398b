"""Parameter importances from Optuna's PED-ANOVA evaluator (no scikit-learn needed), on a scratch study
built from the trial table.

Bounded whatever the study's size: at most :data:`MAX_TRIALS` trials, every k-th feasible successful
trial by number (what PED-ANOVA compares, the best quantile against the whole, keeps its shape in an
even sample), their params and metrics only (no raw samples); and computed once per state of the study
(its change sequence): every open page of a study asks for them after its first draw, and a finished
study's answer never changes.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any

from sqlalchemy import select

from tuner.results.export import objectives_of
from tuner.store.storage import StudyDB, StudyRow, StudySummaryRow, TrialRow

MIN_TRIALS = 4
#: The most trials the evaluator is given (an even sample of a larger study's feasible successful trials).
MAX_TRIALS = 1000
#: How long a running study's answer is served before it is computed again (its sequence moves on with
#: every trial, and every open page of it asks every few seconds).
MAX_AGE_S = 5.0
#: Studies whose answer is kept.
_CACHE_SIZE = 64
#: (database URL, study id) -> (change sequence, monotonic time computed, answer)
_cache: OrderedDict[tuple[str, int], tuple[int, float, dict[str, float]]] = OrderedDict()
_locks: dict[tuple[str, int], threading.Lock] = {}
_guard = threading.Lock()


def importances(db: StudyDB, row: StudyRow) -> dict[str, float]:
    """Importance of each Optuna param for the first objective over feasible ``ok`` trials (an even sample of
    at most :data:`MAX_TRIALS`); {} when too few. Requests for one study while it is computed wait for
    that answer rather than compute it again."""
    with db.Session() as s:
        state = s.execute(
            select(StudySummaryRow.seq, StudySummaryRow.counts).where(StudySummaryRow.study_id == row.id)
        ).first()
    seq = -1 if state is None else int(state.seq or 0)
    n_ok = None if state is None else int((state.counts or {}).get("ok", 0))
    key = (str(db.url), row.id)
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        cached = _fresh(key, seq)
        if cached is not None:
            return cached
        result = _compute(db, row, n_ok)
        with _guard:
            _cache[key] = (seq, time.monotonic(), result)
            _cache.move_to_end(key)
            while len(_cache) > _CACHE_SIZE:
                old, _ = _cache.popitem(last=False)
                _locks.pop(old, None)
        return dict(result)


def _fresh(key: tuple[str, int], seq: int) -> dict[str, float] | None:
    """The kept answer when the study has not changed since, or changed within the last MAX_AGE_S."""
    with _guard:
        cached = _cache.get(key)
    if cached is None or seq < 0:
        return None
    at_seq, at, result = cached
    if at_seq == seq or (at_seq < seq and time.monotonic() - at < MAX_AGE_S):
        return dict(result)
    return None


def _sample(db: StudyDB, study_id: int, n_ok: int | None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(params, metrics) of every ``stride``-th feasible, successful, original trial: at most MAX_TRIALS."""
    stride = max(1, -(-(n_ok or 0) // MAX_TRIALS))
    where = [
        TrialRow.study_id == study_id,
        TrialRow.status == "ok",
        TrialRow.feasible.is_(True),
        TrialRow.duplicate_of.is_(None),
    ]
    if stride > 1:
        where.append(TrialRow.number % stride == 0)
    with db.Session() as s:
        rows = s.execute(
            select(TrialRow.params, TrialRow.metrics).where(*where).order_by(TrialRow.number).limit(MAX_TRIALS)
        ).all()
    return [(params or {}, metrics or {}) for params, metrics in rows]


def _compute(db: StudyDB, row: StudyRow, n_ok: int | None) -> dict[str, float]:
    import optuna

    from tuner.strategy.adapter import ParamEncoder
    from tuner.study.space import compile_space

    trials = _sample(db, row.id, n_ok)
    if len(trials) < MIN_TRIALS:
        return {}
    metric, direction = objectives_of(row)[0]
    encoder = ParamEncoder(compile_space(row.space))  # the params as the sampler saw them (pow2 as log2)
    frozen = []
    for params_in, metrics in trials:
        value = metrics.get(metric)
        params, distributions = encoder.encode(params_in)
        if value is not None and params:
            frozen.append(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    if len(frozen) < MIN_TRIALS:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" per page opened
    scratch = optuna.create_study(direction=direction)
    scratch.add_trials(frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            raw = optuna.importance.get_param_importances(
                scratch, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
            )
        except (ValueError, RuntimeError, ZeroDivisionError):
            return {}
    return {name.removesuffix("__log2"): float(v) for name, v in raw.items() if math.isfinite(v)}
