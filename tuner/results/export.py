"""Export the chosen configuration in the form user code consumes."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from tuner.results.pareto import best_trial, pareto_front
from tuner.store.notes import study_notes
from tuner.store.storage import StudyDB, StudyRow
from tuner.study.spec import objectives_from_spec, objectives_of, objectives_or_error  # noqa: F401 (re-exported)
from tuner.study.yamlio import dump_yaml
from tuner.workloads.base import comment_text
from tuner.workloads.registry import workload_class

FORMATS = ("json", "yaml", "env", "python")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExportError(ValueError):
    pass


def export_document(db: StudyDB, row: StudyRow, trial_number: int | None = None) -> dict[str, Any]:
    """The chosen config (default: best Pareto point on the first objective), its metrics,
    the fingerprint it was measured on, the Pareto front and the spec."""
    trials = db.trials(row.id)
    objectives = objectives_of(row)
    front = pareto_front(trials, objectives)
    if trial_number is None:
        chosen = best_trial(trials, objectives)
        if chosen is None:
            raise ExportError(f"study {row.name!r} has no feasible successful trial yet")
    else:
        chosen = next((t for t in trials if t.number == trial_number), None)
        if chosen is None:
            raise ExportError(f"study {row.name!r} has no trial {trial_number}")
        if chosen.status != "ok":
            raise ExportError(f"trial {trial_number} did not succeed (status {chosen.status})")
    workload = workload_class(row.workload)(**row.spec.get("args", {}))
    document = {
        "study": row.name,
        "study_id": row.id,
        "workload": row.workload,
        "trial": chosen.number,
        "on_pareto_front": any(t.number == chosen.number for t in front),
        "feasible": bool(chosen.feasible),
        "params": chosen.params,
        "config": workload.export_config(dict(chosen.params)),
        "metrics": chosen.metrics,
        "objectives": [{"metric": m, "direction": d} for m, d in objectives],
        "timing_comparable": chosen.timing_comparable,
        "timing": timing_facts(chosen),
        "fingerprint": chosen.fingerprint,
        "pareto_front": [{"trial": t.number, "params": t.params, "metrics": t.metrics} for t in front],
        "space_hash": row.space_hash,
        "spec": row.spec,
        "notes": study_notes(db, row.id),
    }
    provenance = workload.provenance()
    if provenance is not None:
        document["provenance"] = provenance
    return document


#: What each timing mode means, as the export states it.
TIMING_MEANS: dict[str, str] = {
    "eager": "one call as the user makes it: launched from Python, L2 flushed before it, the larger of the "
    "kernel's GPU time and the launcher's host time (median over the repetitions)",
    "cuda_graph": "a call inside a CUDA graph of many calls (timing: cuda_graph): true only for a caller that "
    "replays CUDA graphs; the host's launch is not in it",
    "cpu": "the CPU clock around each call (a CPU or the Triton interpreter): not comparable with GPU timings",
}


def timing_facts(trial: Any) -> dict[str, Any]:
    """How the trial's figures were timed: ``mode`` (``eager`` / ``cuda_graph`` / ``cpu``), the call's
    ``latency_us`` with the 95% interval of its median, ``gpu_us`` and ``host_us`` a call, ``l2`` (``flushed`` or
    ``warm``), the repetitions, and what the mode means. Trials timed before the host time was counted (mode
    ``cuda_events``) say so."""
    timing = (trial.extra or {}).get("timing") or {}
    metrics = trial.metrics or {}
    mode = timing.get("mode")
    facts: dict[str, Any] = {"mode": mode}
    if mode == "cuda_events":
        facts["note"] = "timed with CUDA events around each call: the launcher's host time was not counted"
    elif mode in TIMING_MEANS:
        facts["means"] = TIMING_MEANS[mode]
    if metrics.get("latency_ms") is not None:
        facts["latency_us"] = metrics["latency_ms"] * 1e3
    if timing.get("ci95_ms"):
        facts["median_ci95_us"] = [v * 1e3 for v in timing["ci95_ms"]]
    for key in ("gpu_us", "host_us"):
        if metrics.get(key) is not None:
            facts[key] = metrics[key]
    if timing.get("eager_host_ms") is not None and mode == "cuda_graph":
        facts["eager_host_us"] = timing["eager_host_ms"] * 1e3
    facts["l2"] = timing.get("l2", "flushed" if mode in ("cuda_events", "cuda_graph") else None)
    facts["reps"] = timing.get("reps")
    return {key: value for key, value in facts.items() if value is not None}


def timing_line(facts: dict[str, Any]) -> str | None:
    """One comment line of how the figures were timed (python, env and YAML exports), with the graph-only
    warning where the eager call's host time exceeds the graph's time a call."""
    mode, latency = facts.get("mode"), facts.get("latency_us")
    if mode is None or latency is None:
        return None
    ci = facts.get("median_ci95_us")
    interval = f" (95% CI of the median {ci[0]:.1f}-{ci[1]:.1f} us)" if ci else ""
    parts = f"GPU {facts['gpu_us']:.1f} us, host {facts['host_us']:.1f} us a call" if "gpu_us" in facts else ""
    line = f"timed {mode}: {latency:.1f} us a call{interval}" + (f"; {parts}" if parts else "")
    if mode == "cuda_graph" and facts.get("eager_host_us", 0) > latency:
        line += (
            f"; eager the launcher alone costs {facts['eager_host_us']:.1f} us of host time a call: "
            "this speed holds only inside a CUDA graph"
        )
    elif mode == "cuda_events":
        line += "; " + facts["note"]
    return line


#: What a ``timing_comparable: false`` export says about its speeds.
NOT_COMPARABLE = (
    "timing_comparable: false: timed on a CPU or under the Triton interpreter; numerics are real, "
    "speeds are not comparable with GPU timings"
)


def caveats(document: dict[str, Any]) -> list[str]:
    """The lines an export must carry beside the config: where the measurements come from and whether
    its timings compare with GPU timings."""
    lines = []
    provenance = document.get("provenance")
    if provenance:
        lines.append(str(provenance.get("note", provenance.get("kind", ""))))
    if document.get("timing_comparable") is False:
        lines.append(NOT_COMPARABLE)
    timed = timing_line(document.get("timing") or {})
    if timed:
        lines.append(timed)
    return lines


def env_lines(env: dict[str, str]) -> str:
    """``KEY=value`` lines that a POSIX shell ``source``s to exactly these values: each value is quoted
    (``shlex.quote``), so ``$(...)``, backticks, quotes and newlines in it stay text."""
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise ExportError(f"{key!r} is not an environment variable name")
    return "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in env.items())


def render(document: dict[str, Any], fmt: str) -> str:
    """``json``/``yaml``: the whole document; ``env``: ``KEY=value`` lines, shell-quoted (booleans are
    ``1``/``0``); ``python``: source to paste, every value a Python literal."""
    if fmt == "json":
        return json.dumps(document, indent=2, default=str) + "\n"
    if fmt == "yaml":
        notes = "".join(f"# {comment_text(line)}\n" for line in caveats(document))
        return notes + dump_yaml(json.loads(json.dumps(document, default=str)))
    header = f"study {document['study']}, trial {document['trial']}, workload {document['workload']}"
    comments = "".join(f"# {comment_text(line)}\n" for line in [header, *caveats(document)])
    workload = workload_class(document["workload"])(**document["spec"].get("args", {}))
    if fmt == "env":
        return comments + env_lines(workload.export_env(document["params"]))
    if fmt == "python":
        return comments + workload.export_python(document["params"])
    raise ExportError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
