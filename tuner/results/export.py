"""Export the chosen configuration in the form user code consumes."""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from collections.abc import Mapping
from typing import Any

from tuner.store.notes import study_notes
from tuner.store.queries import kept_results
from tuner.store.storage import StudyDB, StudyRow
from tuner.study.spec import build_error, objectives_from_spec, objectives_of, objectives_or_error  # noqa: F401 (re-exported)
from tuner.study.yamlio import dump_yaml
from tuner.workloads.base import comment_text
from tuner.workloads.registry import workload_class

FORMATS = ("json", "yaml", "env", "python")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
#: Names the env export never sets: what the shell that ``source``s it, the dynamic loader or an interpreter
#: reads (setting them changes what that shell runs, loads or is), and this service's own settings.
ENV_DENIED = frozenset(
    "PATH HOME SHELL IFS ENV CDPATH FPATH GLOBIGNORE SHELLOPTS PS0 PS1 PS2 PS3 PS4 PROMPT_COMMAND HISTFILE MAIL "
    "MAILPATH TMPDIR USER LOGNAME PWD OLDPWD UID EUID PPID TERM EDITOR VISUAL PAGER LANG LANGUAGE GCONV_PATH "
    "LOCPATH NLSPATH HOSTALIASES LOCALDOMAIN RES_OPTIONS NODE_OPTIONS PERL5LIB PERL5OPT PERLLIB RUBYLIB RUBYOPT "
    "JAVA_TOOL_OPTIONS ZDOTDIR".split()
)
#: Name prefixes the env export never sets (the loader's ``LD_*`` / ``DYLD_*``, ``PYTHON*``, ``BASH*``, ...).
ENV_DENIED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "BASH", "LC_", "GIT_", "SSH_", "TUNER_")
#: Characters an env value holds raw inside single quotes (every other control character is escaped).
_RAW_CONTROLS = "\t\n"


class ExportError(ValueError):
    pass


class ExportRefused(ExportError):
    """The study's config cannot be exported in the asked form (the API answers 422)."""


#: Front trials an export lists by default (``pareto_front_total`` says how many the front has).
FRONT_LIMIT = 100


def export_document(
    db: StudyDB, row: StudyRow, trial_number: int | None = None, *, limit: int | None = FRONT_LIMIT
) -> dict[str, Any]:
    """The chosen config (default: the pick the study's summary keeps), its metrics, the fingerprint it was
    measured on, the first ``limit`` trials of the Pareto front (None: all of it) and the spec. Read from
    the summary and by trial number (``queries.kept_results``): no scan of the study's trials."""
    error = build_error(row)
    if error is not None:
        raise ExportRefused(f"study {row.name!r} cannot be exported: {error}")
    objectives = objectives_of(row)
    kept = kept_results(db, row, limit=limit)
    if trial_number is None:
        chosen = kept.pick
        if chosen is None:
            raise ExportError(f"study {row.name!r} has no feasible successful trial yet")
    else:
        chosen = db.trial(row.id, trial_number)
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
        "on_pareto_front": chosen.number in kept.numbers,
        "feasible": bool(chosen.feasible),
        "params": chosen.params,
        "config": workload.export_config(dict(chosen.params)),
        "metrics": chosen.metrics,
        "objectives": [{"metric": m, "direction": d} for m, d in objectives],
        "timing_comparable": chosen.timing_comparable,
        "timing": timing_facts(chosen),
        "fingerprint": chosen.fingerprint,
        "pareto_front": [{"trial": t.number, "params": t.params, "metrics": t.metrics} for t in kept.front],
        "pareto_front_total": len(kept.numbers),
        "pareto_front_limit": limit,
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


def env_lines(env: dict[str, str], params: Mapping[str, Any] | None = None) -> str:
    """``KEY=value`` lines that a shell ``source``s to exactly these values: each value is quoted
    (``shlex.quote``), so ``$(...)``, backticks, quotes and newlines in it stay text; a value with another
    control character (ESC, BEL, CR, DEL, C1) is ANSI-C quoted (``$'...'``, bash, zsh, ksh, dash 0.5.12+), each
    such character's UTF-8 bytes as ``\\xHH``, so the file holds none raw. Only names of the form
    ``[A-Z][A-Z0-9_]*`` outside :data:`ENV_DENIED` / :data:`ENV_DENIED_PREFIXES` are written; another name, or a
    value holding NUL (which no environment variable can), raises :class:`ExportRefused` naming the param
    (``params``: the config, to find the param a name comes from)."""
    lines = []
    for key, value in env.items():
        param = next((p for p in params or {} if str(p).upper() == key), key)
        why = _env_name_refused(key)
        if why:
            raise ExportRefused(f"the env export refuses param {param!r} (variable {key!r}): {why}; rename the param")
        text = str(value)
        if "\0" in text:
            raise ExportRefused(f"the env export refuses param {param!r}: its value holds NUL, which no variable can")
        lines.append(f"{key}={_shell_quoted(text)}\n")
    return "".join(lines)


def _env_name_refused(key: str) -> str | None:
    """Why ``key`` may not be set by an export, or None."""
    if not _ENV_NAME.fullmatch(key):
        return "an exported name is upper-case letters, digits and '_', starting with a letter"
    if key in ENV_DENIED or key.startswith(ENV_DENIED_PREFIXES):
        return "the shell, the dynamic loader or an interpreter reads that variable"
    return None


def _shell_quoted(text: str) -> str:
    if not any(unicodedata.category(c) == "Cc" and c not in _RAW_CONTROLS for c in text):
        return shlex.quote(text)
    out = []
    for c in text:
        if c in "\\'":
            out.append("\\" + c)
        elif unicodedata.category(c) == "Cc" and c not in _RAW_CONTROLS:
            out.extend(f"\\x{b:02x}" for b in c.encode())
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


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
        return comments + env_lines(workload.export_env(document["params"]), document["params"])
    if fmt == "python":
        return comments + workload.export_python(document["params"])
    raise ExportError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
