"""The soak's figures from what it recorded (``bench/soak.py``'s ``Record``: every response's start, end,
endpoint, status and Retry-After, and the event streams' drops): latencies per endpoint, 5xx and errors
inside and outside the blip windows, responses per second, trial rates and pauses, targets."""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

LEFT_AFTER_S = 5.0  # when what a killed runner left behind is counted


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latencies(rec: Any) -> dict[str, Any]:
    by: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, Counter] = defaultdict(Counter)
    for start, end, label, status, _ in rec.responses:
        statuses[label][str(status)] += 1
        if status == 200:
            by[label].append((end - start) * 1000)
    out = {}
    for label in sorted(statuses):
        ms = by[label]
        out[label] = {
            "responses": sum(statuses[label].values()),
            "statuses": dict(statuses[label]),
            "p50_ms": round(statistics.median(ms), 1) if ms else None,
            "p95_ms": round(percentile(ms, 0.95), 1) if ms else None,
            "max_ms": round(max(ms), 1) if ms else None,
        }
    return out


def classify(rec: Any, windows: list[tuple[float, float]], t0: float) -> dict[str, Any]:
    """5xx and transport errors inside and outside the windows (a request overlapping one is inside)."""

    def inside(start: float, end: float) -> bool:
        return any(start <= hi and end >= lo for lo, hi in windows)

    out: dict[str, Any] = {"5xx_inside": 0, "5xx_outside": 0, "non_503_5xx_inside": 0, "503_without_retry_after": 0}
    out |= {"errors_inside": 0, "errors_outside": 0}
    samples = []
    for start, end, label, status, retry_after in rec.responses:
        where = "inside" if inside(start, end) else "outside"
        if isinstance(status, str):
            out[f"errors_{where}"] += 1
        elif status >= 500:
            out[f"5xx_{where}"] += 1
            out["non_503_5xx_inside"] += where == "inside" and status != 503
            out["503_without_retry_after"] += status == 503 and not retry_after
        else:
            continue
        if len(samples) < 40 or where == "outside":
            sample = {"t_s": round(start - t0, 2), "ms": round((end - start) * 1000), "endpoint": label}
            samples.append({**sample, "status": status, "where": where})
    out["drops_inside"] = sum(inside(t, t) for t, _ in rec.stream_drops)
    out["drops_outside"] = len(rec.stream_drops) - out["drops_inside"]
    out["drop_samples"] = [{"t_s": round(t - t0, 2), "error": name} for t, name in rec.stream_drops[:20]]
    out["samples"] = samples[:100]
    return out


def timeline(rec: Any, t0: float) -> dict[str, dict[str, int]]:
    """Responses by second of the soak (request start) and status."""
    per: dict[int, Counter] = defaultdict(Counter)
    for start, _, _, status, _ in rec.responses:
        per[int(start - t0)][str(status)] += 1
    return {str(s): dict(per[s]) for s in sorted(per)}


def rates(finished: list[float], first_started: float | None, t0: float, t1: float, events: list[dict]) -> dict:
    done = sorted(finished)
    span = (done[-1] - first_started) if done and first_started else None
    during = sum(t0 <= t < t1 for t in done) / (t1 - t0)
    out = {
        "trials_per_s_overall": round(len(done) / span, 2) if span else None,
        "trials_per_s_during_soak": round(during, 2),
        "study_wall_s": round(span, 1) if span else None,
    }
    for event in events:  # the longest pause in finished trials after each fault
        after = [t for t in done if t >= event["start"]]
        gap = (after[0] - max([t for t in done if t < event["start"]], default=event["start"])) if after else None
        out[f"pause_after_{event['event'].replace(' ', '_')}_s"] = None if gap is None else round(gap, 1)
    return out


def target(name: str, tuned: Any, goal: Any) -> dict[str, Any]:
    """A target as the results files write one, met when the figure equals its goal; these have no baseline
    to be a ratio of (``baseline`` and ``ratio`` are null)."""
    verdict = "met" if tuned == goal else "missed"
    return {"target": name, "tuned": tuned, "baseline": None, "ratio": None, "goal": goal, "verdict": verdict}


def runner_log(log: Path, t0: float) -> list[list[Any]]:
    """The runners' moves in the server's log (start, claim, hand-back), at seconds from ``t0``, and the
    supervisor's lines (exits, restarts: no time): what the pause after a SIGKILL is made of (the lease
    lapsing, the new runner's Ray starting)."""
    import datetime as dt

    out: list[list[Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("runner (pid") or line.startswith("killed "):  # the supervisor's, not time-stamped
            out.append([None, line[:120]])
        events = ("waiting for studies", "took study", "handed")
        if "tuner.run.service" not in line or not any(w in line for w in events):
            continue
        with contextlib.suppress(ValueError):
            stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged
            out.append([round(stamp - t0, 1), line.split(" INFO ", 1)[-1].split(" in postgresql")[0][:120]])
    return out


def event_out(event: dict[str, Any], t0: float) -> dict[str, Any]:
    """An event for the JSON: its times in seconds from the soak's start."""
    back = event["healthy_again"]
    return {
        **{k: v for k, v in event.items() if k not in ("start", "end", "healthy_again", "window")},
        "at_s": round(event["start"] - t0, 2),
        "command_s": round(event["end"] - event["start"], 2),
        "healthy_again_after_s": None if back is None else round(back - event["start"], 2),
        "window_s": [round(event["window"][0] - t0, 2), round(event["window"][1] - t0, 2)],
    }


def summarize(run: dict[str, Any], left: list[dict[str, Any]]) -> list[dict[str, Any]]:
    trials, errors = run["trials"], run["errors"]
    return [
        target("trials lost", trials["lost"], 0),
        target("trial numbers repeated", trials["numbers_repeated"], 0),
        target("measured trials = budget", trials["measured"], trials["budget"]),
        target("study status when the clients stopped", run["status_when_soak_ended"], "running"),
        target("study status", trials["study_status"], "completed"),
        target("5xx outside the blips", errors["5xx_outside"], 0),
        target("5xx other than 503 inside the blips", errors["non_503_5xx_inside"], 0),
        target("503 without Retry-After", errors["503_without_retry_after"], 0),
        target("transport errors outside the blips", errors["errors_outside"], 0),
        target("event streams cut outside the blips", errors["drops_outside"], 0),
        target(f"killed runner's processes alive {LEFT_AFTER_S:g} s later", len(run["killed_runner_left_behind"]), 0),
        target("processes left behind after the server's stop", len(left), 0),
    ]
