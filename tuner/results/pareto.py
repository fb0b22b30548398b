"""Pareto front and the default pick, computed from the study database (the source of truth)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class TrialLike(Protocol):
    number: int
    status: str
    metrics: Mapping[str, Any]
    feasible: bool | None


def _key(trial: TrialLike, objectives: Sequence[tuple[str, str]]) -> tuple[float, ...] | None:
    """Objective values as "smaller is better" numbers, or None if any is missing."""
    out = []
    for metric, direction in objectives:
        value = trial.metrics.get(metric)
        if value is None:
            return None
        out.append(-float(value) if direction == "maximize" else float(value))
    return tuple(out)


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(trials: Sequence[TrialLike], objectives: Sequence[tuple[str, str]]) -> list[TrialLike]:
    """The non-dominated feasible ``ok`` trials, ordered by the first objective (best first).

    Distinct trials with equal objective values are all kept; copies (``duplicate_of``) are not.
    """
    candidates = []
    for trial in trials:
        if trial.status != "ok" or not trial.feasible or getattr(trial, "duplicate_of", None) is not None:
            continue  # copies of a repeated config stand behind their original
        key = _key(trial, objectives)
        if key is not None:
            candidates.append((key, trial))
    # In (key, number) order a point's dominators all come before it (a dominator is lexicographically
    # smaller), and a dominated dominator is itself dominated by a front point (transitivity): so each
    # point is checked against the front found so far, not against every point (O(n * front), not O(n^2)).
    candidates.sort(key=lambda kt: (kt[0], kt[1].number))
    front: list[tuple[tuple[float, ...], TrialLike]] = []
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
    if not front:
        return None
    metric, direction = objectives[0]
    remeasured = [
        t
        for t in trials
        if t.status == "ok"
        and t.feasible
        and getattr(t, "duplicate_of", None) is None
        and (r := getattr(t, "remeasured", None))
        and r.get("metric") == metric
        and r.get("median") is not None
    ]
    if remeasured:
        sign = -1.0 if direction == "maximize" else 1.0
        return min(remeasured, key=lambda t: (sign * t.remeasured["median"], t.number))
    return front[0]
