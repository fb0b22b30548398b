"""The Pareto front and the default pick computed from a list of trials (a reference, and for trials not
in one study's store, such as two studies' fronts combined). A study's results are read from the front and
pick its store keeps (``tuner.store.queries.kept_results``); both use the key, dominance and pick rule of
``tuner.store.summary``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tuner.store.summary import dominates, objective_key, pick_number


class TrialLike(Protocol):
    number: int
    status: str
    metrics: Mapping[str, Any]
    feasible: bool | None


def pareto_front(trials: Sequence[TrialLike], objectives: Sequence[tuple[str, str]]) -> list[TrialLike]:
    """The non-dominated feasible ``ok`` trials, ordered by the first objective (best first).

    Distinct trials with equal objective values are all kept; copies (``duplicate_of``) are not.
    """
    candidates = []
    for trial in trials:
        if trial.status != "ok" or not trial.feasible or getattr(trial, "duplicate_of", None) is not None:
            continue  # copies of a repeated config stand behind their original
        key = objective_key(trial.metrics or {}, objectives)
        if key is not None:
            candidates.append((key, trial))
    # In (key, number) order a point's dominators all come before it (a dominator is lexicographically
    # smaller), and a dominated dominator is itself dominated by a front point (transitivity): so each
    # point is checked against the front found so far, not against every point (O(n * front), not O(n^2)).
    candidates.sort(key=lambda kt: (kt[0], kt[1].number))
    front: list[tuple[list[float], TrialLike]] = []
    for key, trial in candidates:
        if not any(dominates(other, key) for other, _ in front):
            front.append((key, trial))
    return [t for _, t in front]


def best_trial(trials: Sequence[TrialLike], objectives: Sequence[tuple[str, str]]) -> TrialLike | None:
    """The default pick: the Pareto point best on the first objective (ties: the next objectives).

    When the top candidates (by the first objective) were re-measured interleaved, the pick is the one
    with the best median: a lead smaller than clock drift does not decide.
    """
    front = pareto_front(trials, objectives)
    metric = objectives[0][0] if objectives else None
    remeasured = {
        t.number: float(r["median"])
        for t in trials
        if t.status == "ok"
        and t.feasible
        and getattr(t, "duplicate_of", None) is None
        and (r := getattr(t, "remeasured", None))
        and r.get("metric") == metric
        and r.get("median") is not None
    }
    number = pick_number([t.number for t in front], remeasured, objectives)
    return next((t for t in trials if t.number == number), None)
