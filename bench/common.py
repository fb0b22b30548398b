"""What the per-workload benchmark scripts share: run a study with the engine, compare interleaved, write JSON.

A benchmark runs a study with the tuner (the whole engine: Optuna, Ray workers, SQLite) and,
in the same run, its baseline with the same stopwatch (:func:`tuner.workloads.measure.time_fn`). The
tuned winner and the baseline are then re-measured A B A B ... (:func:`interleaved`), so clock
drift favours neither, and the ratio of the medians is compared with the target
(:func:`verdict`). :func:`write_result` adds the fingerprint, the date and the command line.

Run the scripts from the repository root (``PYTHONPATH=.``), e.g.
``python bench/attention_study.py --out bench/results/attention-h200.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class StudyRun:
    """What :func:`run_study` returns: the engine's summary and every trial row."""

    spec: dict[str, Any]
    summary: Any  # tuner.run.orchestrator.StudySummary
    trials: list[Any]  # tuner.store.storage trial rows
    space_points: int
    wall_s: float

    def ok(self, **params: Any) -> list[Any]:
        """Measured OK trials (no repeats), optionally only those whose params match ``params``."""
        return [
            t
            for t in self.trials
            if t.status == "ok"
            and t.duplicate_of is None
            and all(t.params.get(name) == value for name, value in params.items())
        ]

    def best(self, metric: str, maximize: bool = True, **params: Any) -> Any | None:
        rows = [t for t in self.ok(**params) if t.metrics.get(metric) is not None]
        if not rows:
            return None
        return (max if maximize else min)(rows, key=lambda t: t.metrics[metric])

    def describe(self) -> dict[str, Any]:
        """The study in a benchmark's JSON: budget, timings, status counts, failures."""
        measured = [t for t in self.trials if t.status != "infeasible_static" and t.duplicate_of is None]
        loop_minutes = self.summary.loop_s / 60
        return {
            "spec": self.spec,
            "space_points": self.space_points,
            "study_status": self.summary.status,
            "trials_measured": len(measured),
            "trials_static_pruned": sum(t.status == "infeasible_static" for t in self.trials),
            "status_breakdown": self.summary.counts,
            "trials_per_minute": round(len(measured) / loop_minutes, 2) if loop_minutes else None,
            "startup_s": round(self.summary.startup_s, 1),
            "study_loop_s": round(self.summary.loop_s, 1),
            "wall_s": round(self.wall_s, 1),
            "failures": [
                {"trial": t.number, "status": t.status, "params": t.params, "error": (t.error or "")[-300:]}
                for t in measured
                if t.status != "ok"
            ],
            # Every trial in order, so that a study's path (seeds, samples, re-measurements, what was
            # still running at the deadline) can be read back from the JSON alone.
            "trials": [
                {
                    "trial": t.number,
                    "status": t.status,
                    "duplicate_of": t.duplicate_of,
                    "params": t.params,
                    "metrics": {k: v for k, v in (t.metrics or {}).items() if isinstance(v, (int, float))},
                }
                for t in self.trials
            ],
        }


def run_study(spec: dict[str, Any], *, db_path: str | None = None, quiet: bool = False) -> StudyRun:
    """Run ``spec`` (a study spec as a dict) to completion with the engine on this machine's GPUs."""
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    compiled = load_spec(spec)
    path = db_path or str(Path(tempfile.mkdtemp()) / "study.db")
    db = StudyDB(path)

    def on_progress(p: Any) -> None:
        if not quiet:
            best = f"{p.best_value:.4g}" if p.best_value is not None else "-"
            print(f"  [{spec['name']}] {p.finished}/{p.budget_trials} done, {p.failed} failed, best {best}", flush=True)

    start = time.time()
    summary = Orchestrator(compiled, db, progress=on_progress).run()
    return StudyRun(spec, summary, db.trials(summary.study_id), compiled.space.size(), time.time() - start)


def gang_backend() -> str:
    """The process-group backend of a multi-GPU benchmark: nccl on GPUs; gloo on a CPU (a smoke run:
    the NCCL knobs are then inert)."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def tflops_measurer(call: Callable[[], Any], flops: float) -> Callable[[], float]:
    """A function that times ``call`` on this machine's GPU (``time_fn`` with ``GPU_TIMING``: CUDA events, L2
    flushed, adaptive repetitions) and returns its TFLOP/s for ``flops`` operations a call."""
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import GPU_TIMING, time_fn

    device = device_info()
    return lambda: flops / (time_fn(call, device, **GPU_TIMING).median_ms * 1e-3) / 1e12


def interleaved(candidates: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, list[float]]:
    """Call each candidate in turn, ``rounds`` times (A B C A B C ...); every value it returned, by name."""
    values: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            values[name].append(float(fn()))
    return values


def median(values: list[float]) -> float | None:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else None


def ratio_span(numerator: list[float], denominator: list[float], paired: bool = True) -> list[float] | None:
    """The span [low, high] of ``numerator / denominator`` over the rounds: ``paired`` (interleaved rounds, value i
    of each measured side by side) the per-round ratios' least and greatest; else the widest it can be (least
    numerator over greatest denominator, and the reverse). None without two finite values of each."""
    if paired:
        ratios = [a / b for a, b in zip(numerator, denominator, strict=False) if a == a and b == b and a and b]
        return [min(ratios), max(ratios)] if len(ratios) >= 2 else None
    num = [v for v in numerator if v == v and v]
    den = [v for v in denominator if v == v and v]
    return [min(num) / max(den), max(num) / min(den)] if min(len(num), len(den)) >= 2 else None


def verdict(ratio: float | None, target: float, strictly: bool = False) -> str:
    """``"met"`` / ``"missed"`` for a ratio against its target (``"no result"`` when there is none)."""
    if ratio is None:
        return "no result"
    return "met" if (ratio > target if strictly else ratio >= target) else "missed"


def write_result(result: dict[str, Any], out: str | None) -> None:
    """Add fingerprint, date and command to ``result``; write it as JSON to ``out`` and print a short form."""
    from tuner.workloads.fingerprint import fingerprint

    command = " ".join(["python", *sys.argv])
    out_dir = os.environ.get("OUT")
    if out_dir:  # the results folder of the machine that ran it is not part of the command
        command = command.replace(out_dir.rstrip("/") + "/", "")
    full = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "fingerprint": fingerprint(),
        **result,
    }
    text = json.dumps(full, indent=2, default=str)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(json.dumps(result.get("summary", {}), indent=2, default=str))
