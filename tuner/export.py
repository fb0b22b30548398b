"""Export the chosen configuration in the form user code consumes."""

from __future__ import annotations

import json
import re
import shlex
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

from tuner.db_engine import UnreadableJSON
from tuner.pareto import best_trial, pareto_front
from tuner.registry import workload_class
from tuner.spec import StudySpec
from tuner.storage import StudyDB, StudyRow
from tuner.workload import comment_text
from tuner.yamlio import dump_yaml

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


def objectives_from_spec(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(metric, direction) of a stored spec's objectives, directions defaulted by its workload (which is
    built: this raises whatever building it raises). Called once, when a study is stored."""
    parsed = StudySpec.model_validate(spec)
    workload = workload_class(parsed.workload)(**parsed.args)
    directions = {m.name: m.direction for m in workload.metric_specs()}
    return [(o.metric, o.direction or directions[o.metric]) for o in parsed.objectives]


def objectives_of(row: StudyRow) -> list[tuple[str, str]]:
    """The study's objectives as stored with it; a study stored before they were has them rebuilt from its
    spec (raising what that raises: see :func:`objectives_or_error`)."""
    if row.objectives is not None:
        return [(o["metric"], o["direction"]) for o in row.objectives]
    return objectives_from_spec(row.spec)


def objectives_or_error(row: StudyRow) -> tuple[list[tuple[str, str]], str | None]:
    """:func:`objectives_of` (no objectives where they cannot be had), and :func:`build_error`: why the study
    cannot be run or exported as it is stored, or None."""
    error = build_error(row)
    try:
        return objectives_of(row), error
    except Exception as exc:  # whatever the workload raises, the study is still listed
        return [], error or _one_line(f"its workload can no longer be built: {type(exc).__name__}: {exc}")


#: Seconds a study's :func:`build_error` verdict is kept (every list entry asks; a moved file shows after this).
BUILD_CHECK_TTL_S = 10.0
_build_checks: dict[str, tuple[float, str | None]] = {}


def build_error(row: StudyRow) -> str | None:
    """Why the study's stored spec no longer builds its workload (a spec that is not JSON or not an object, an
    arg that no longer validates, a replay landscape moved away), or None. Kept ``BUILD_CHECK_TTL_S`` seconds
    by workload and args."""
    spec = row.spec
    if isinstance(spec, UnreadableJSON):
        return f"its stored spec is not JSON ({spec.reason})"
    if not isinstance(spec, dict):
        return f"its stored spec is not an object but a JSON {type(spec).__name__}"
    key = json.dumps([row.workload, spec.get("args")], sort_keys=True, default=str)
    now = time.monotonic()
    kept = _build_checks.get(key)
    if kept is not None and now - kept[0] < BUILD_CHECK_TTL_S:
        return kept[1]
    try:
        workload_class(row.workload)(**spec.get("args", {}))
        error = None
    except Exception as exc:  # whatever the workload raises is the reason
        error = _one_line(f"its workload can no longer be built: {type(exc).__name__}: {exc}")
    if len(_build_checks) >= 4096:
        _build_checks.clear()
    _build_checks[key] = (now, error)
    return error


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def export_document(db: StudyDB, row: StudyRow, trial_number: int | None = None) -> dict[str, Any]:
    """The chosen config (default: best Pareto point on the first objective), its metrics,
    the fingerprint it was measured on, the Pareto front and the spec. A study whose stored spec no longer
    builds raises :class:`ExportRefused` saying why."""
    error = build_error(row)
    if error is not None:
        raise ExportRefused(f"study {row.name!r} cannot be exported: {error}")
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
