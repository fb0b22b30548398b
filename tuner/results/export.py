"""Export the chosen configuration in the form user code consumes."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from tuner.results.pareto import best_trial, pareto_front
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
        "fingerprint": chosen.fingerprint,
        "pareto_front": [{"trial": t.number, "params": t.params, "metrics": t.metrics} for t in front],
        "space_hash": row.space_hash,
        "spec": row.spec,
    }
    provenance = workload.provenance()
    if provenance is not None:
        document["provenance"] = provenance
    return document


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
