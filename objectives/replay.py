"""``replay``: answer trials from a recorded landscape, so search strategies can be compared on a CPU.

A landscape (``bench/landscapes/*.jsonl``, written by ``bench/landscape.py``) is JSON Lines:
a header object, then one object per config of a fixed grid::

    {"kind": "landscape", "format": 1, "workload": "triton_gemm", "args": {...},
     "fingerprint": {...}, "grid": {"BLOCK_M": [64, 128], ...},
     "metrics": [{"name": "tflops", "direction": "maximize", "unit": "TFLOP/s"}, ...]}
    {"params": {"BLOCK_M": 64, ...}, "status": "ok", "metrics": {"tflops": 512.3, ...}, "samples": [...]}
    {"params": {...}, "status": "out_of_resources", "metrics": {}, "samples": [], "error": "..."}

The ``replay`` workload's space is the grid (every param categorical over its recorded
values) and its metrics are the header's. A trial of recorded params gets the recorded
status, metrics and samples; params that were not recorded are ``infeasible_static``
(answered by ``static_check``, so they cost no worker time). Public landscapes converted
to this format replay the same way.

Landscape files are confined: ``file`` must name a ``.jsonl`` file inside ``bench/landscapes/`` of the
project or inside a directory named by ``TUNER_LANDSCAPE_DIR`` (several separated by ``os.pathsep``; set it
on every machine that runs trials). Absolute paths elsewhere, ``..``, ``~user`` and symlinks that lead out
are refused, with one message whether or not the file exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from tuner.workloads.base import DeviceInfo, MetricSpec, TrialContext, TrialResult, TrialStatus, Workload, is_pow2

FORMAT = 1
#: Where a relative ``file`` is also looked for: the repository root (Ray workers may run elsewhere).
_REPO_ROOT = Path(__file__).resolve().parents[1]
#: The project's recorded landscapes, always readable.
DEFAULT_LANDSCAPE_DIR = _REPO_ROOT / "bench" / "landscapes"
#: Names more directories landscapes may be read from (``os.pathsep``-separated).
LANDSCAPE_DIR_ENV = "TUNER_LANDSCAPE_DIR"


def params_key(params: dict[str, Any]) -> str:
    """The canonical text of a config, the landscape's lookup key."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def landscape_dirs() -> list[Path]:
    """The directories landscapes may be read from, symlinks resolved: ``bench/landscapes/`` and those
    ``TUNER_LANDSCAPE_DIR`` names."""
    extra = [d for d in os.environ.get(LANDSCAPE_DIR_ENV, "").split(os.pathsep) if d.strip()]
    return [Path(os.path.realpath(d)) for d in [DEFAULT_LANDSCAPE_DIR, *extra]]


def refused(file: object) -> ValueError:
    """The one error for a ``file`` that cannot be read, whatever the reason: it must not tell a client
    whether a path exists on the server."""
    return ValueError(
        f"file: {file!r} is not a .jsonl landscape in bench/landscapes/ or a directory named by ${LANDSCAPE_DIR_ENV}"
    )


def resolve_file(file: str) -> Path:
    """The landscape ``file`` names: as given, relative to the working directory or the repository root,
    or relative to a landscape directory; it must lie, symlinks resolved, inside one of
    :func:`landscape_dirs`. Raises :func:`refused` otherwise (missing, elsewhere, ``..``, ``~``)."""
    if not isinstance(file, str) or not file or file.startswith("~") or "\x00" in file:
        raise refused(file)
    path = Path(file)
    if ".." in path.parts or path.suffix != ".jsonl":
        raise refused(file)
    dirs = landscape_dirs()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, _REPO_ROOT / path, *(d / path for d in dirs)]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        if any(real.is_relative_to(d) for d in dirs) and real.is_file():
            return real
    raise refused(file)


def grid_param(values: list[Any]) -> dict[str, Any]:
    """A space param over a grid axis: ``pow2`` when the values are every power of two between the least and the
    greatest, ``int`` when they are every integer between them, else ``categorical`` (strings, booleans, gaps).

    Ordered params let a sampler learn "larger tiles are better"; a categorical hides that order.
    """
    ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(values) >= 2 and len(ints) == len(values) and len(set(ints)) == len(ints):
        low, high = min(ints), max(ints)
        if all(is_pow2(v) for v in ints) and len(ints) == high.bit_length() - low.bit_length() + 1:
            return {"type": "pow2", "low": low, "high": high}
        if len(ints) == high - low + 1:
            return {"type": "int", "low": low, "high": high}
    return {"type": "categorical", "choices": list(values)}


def _display_name(path: Path) -> str:
    """A landscape's path as a user names it: relative to the repository when inside it, else its file name
    (never a server's directory layout)."""
    try:
        return str(path.relative_to(_REPO_ROOT))
    except ValueError:
        return path.name


class Landscape:
    """A parsed landscape file: header, grid, metrics and the records by params."""

    def __init__(self, path: Path) -> None:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"file: {path} is empty")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as exc:
            raise ValueError(f"file: {path}:1 is not JSON ({exc.msg})") from None
        if not isinstance(header, dict) or header.get("kind") != "landscape":
            raise ValueError(f'file: {path}:1 must be the header, an object with "kind": "landscape"')
        if header.get("format") != FORMAT:
            raise ValueError(f"file: {path} has format {header.get('format')!r}, this reader knows {FORMAT}")
        grid = header.get("grid")
        if not isinstance(grid, dict) or not grid or not all(isinstance(v, list) and v for v in grid.values()):
            raise ValueError(f"file: {path} header needs a non-empty grid of param -> list of values")
        metrics = header.get("metrics")
        if not isinstance(metrics, list) or not metrics:
            raise ValueError(f"file: {path} header needs a non-empty list of metrics")
        self.header = header
        self.path_name = _display_name(path)
        self.grid: dict[str, list[Any]] = grid
        self.metric_specs = tuple(
            MetricSpec(m["name"], m.get("direction", "maximize"), m.get("unit", ""), m.get("description", ""))
            for m in metrics
        )
        self.records: dict[str, dict[str, Any]] = {}
        for lineno, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"file: {path}:{lineno} is not JSON ({exc.msg})") from None
            params = record.get("params") if isinstance(record, dict) else None
            if not isinstance(params, dict) or "status" not in record:
                raise ValueError(f"file: {path}:{lineno} needs params (an object) and status")
            TrialStatus(record["status"])  # refuses an unknown status
            self.records[params_key(params)] = record

    @property
    def on_gpu(self) -> bool:
        """Whether the landscape was recorded on a GPU (its timings compare with GPU timings)."""
        fingerprint = self.header.get("fingerprint") or {}
        return fingerprint.get("device_kind") == "cuda" and not fingerprint.get("triton_interpret")


class Replay(Workload):
    """Trials answered from a recorded landscape. Args: ``file`` (path of a ``.jsonl`` landscape),
    ``delay_ms`` (default 0: how long each trial pretends to take, to exercise the engine's timing paths)
    and ``seeds`` (default none: configs of the grid to try first, as a workload's space file gives them)."""

    name: ClassVar[str] = "replay"
    unkeyed_args: ClassVar[tuple[str, ...]] = ("delay_ms", "seeds")
    space_file: ClassVar[str] = ""
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    description: ClassVar[str] = (
        "Answers trials from a recorded landscape (bench/landscapes/*.jsonl); space and metrics from the file"
    )

    _cache: ClassVar[dict[tuple[str, float], Landscape]] = {}

    def __init__(self, file: str, delay_ms: float = 0.0, seeds: list[dict[str, Any]] | None = None) -> None:
        if not isinstance(file, str) or not file:
            raise ValueError(f"file must be the path of a landscape (.jsonl), got {file!r}")
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float) or not 0 <= delay_ms <= 60_000:
            raise ValueError(f"delay_ms must be a number of milliseconds in [0, 60000], got {delay_ms!r}")
        path = resolve_file(file)
        try:
            key = (str(path), path.stat().st_mtime)
            landscape = self._cache.get(key)
            if landscape is None:
                landscape = Landscape(path)
                self._cache[key] = landscape
        except OSError:  # unreadable: said as a missing file is
            raise refused(file) from None
        self.landscape = landscape
        self.delay_ms = float(delay_ms)
        if seeds is not None and (not isinstance(seeds, list) or not all(isinstance(x, dict) for x in seeds)):
            raise ValueError(f"seeds must be a list of configs (objects), got {seeds!r}")
        self.seeds = list(seeds or [])

    def metric_specs(self) -> tuple[MetricSpec, ...]:
        return self.landscape.metric_specs

    def provenance(self) -> dict[str, Any]:
        """The landscape the trials are answered from: its file, the machine it was recorded on, and a note
        that says the metrics were measured there, not by this study."""
        header = self.landscape.header
        fingerprint = header.get("fingerprint") or {}
        kind = "GPU" if self.landscape.on_gpu else "recorded"
        return {
            "kind": "replayed",
            "measured": f"replayed, recorded on {self.recorded_where()}",
            "note": (
                f"replayed, recorded on {self.recorded_where()} ({header.get('date', 'date unknown')}): {kind} "
                f"measurements of {header.get('workload', '?')} {json.dumps(header.get('args', {}), sort_keys=True)};"
                " this study ran and timed nothing"
            ),
            "file": self.landscape.path_name,
            "recorded_workload": header.get("workload"),
            "recorded_args": header.get("args"),
            "recorded_at": header.get("date"),
            "recorded_on": fingerprint,
        }

    def recorded_where(self) -> str:
        """The machine the landscape was recorded on, as a user names it (its GPUs, else its device kind)."""
        fingerprint = self.landscape.header.get("fingerprint") or {}
        return ", ".join(fingerprint.get("gpu_names") or []) or fingerprint.get("device_kind") or "an unknown device"

    def trial_fingerprint(self, local: dict[str, Any]) -> dict[str, Any]:
        """The recorded machine's fingerprint (the trials' measurements were taken there), marked ``replayed``,
        with ``measured`` saying so in words and ``replayed_on`` naming the host that answered the trials."""
        recorded = self.landscape.header.get("fingerprint") or {}
        return {
            "measured": f"replayed, recorded on {self.recorded_where()}",
            "replayed": True,
            **recorded,
            "replayed_on": f"{local.get('hostname', '?')} ({local.get('device_kind', '?')})",
        }

    def space_document(self) -> dict[str, Any]:
        """The grid as a space, in the grid's order, ``seeds`` first: each param keeps the order its values
        have in a workload's own space (see :func:`grid_param`), so samplers see what they would see there."""
        return {
            "version": 1,
            "workloads": [self.name],
            "params": {name: self._param(name, values) for name, values in self.landscape.grid.items()},
            "seeds": self.seeds,
        }

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        record = self.landscape.records.get(params_key(self._grid_params(config)))
        if record is None:
            return "config not in the recorded landscape"
        if record["status"] == TrialStatus.INFEASIBLE_STATIC.value:
            return record.get("error") or "statically infeasible when recorded"
        return None

    def run(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> TrialResult:
        comparable = self.landscape.on_gpu
        reason = self.static_check(config, device)
        if reason is not None:
            return TrialResult(TrialStatus.INFEASIBLE_STATIC, error=reason, timing_comparable=comparable)
        record = self.landscape.records[params_key(self._grid_params(config))]
        if self.delay_ms:
            time.sleep(self.delay_ms / 1e3)
        metrics = {k: float(v) if v is not None else float("nan") for k, v in (record.get("metrics") or {}).items()}
        return TrialResult(
            TrialStatus(record["status"]),
            metrics=metrics,
            samples_ms=[float(s) for s in record.get("samples") or []],
            error=record.get("error"),
            timing_comparable=comparable,
            extra={"replayed_from": self.landscape.header.get("workload"), "landscape": self.landscape.path_name},
        )

    def _param(self, name: str, values: list[Any]) -> dict[str, Any]:
        """A grid axis as a space param, with its condition when the header gives one (``when``)."""
        when = (self.landscape.header.get("when") or {}).get(name)
        return {**grid_param(values), "when": when} if when else grid_param(values)

    def _grid_params(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as the landscape keys it: every grid param; a conditional one only when present."""
        conditional = self.landscape.header.get("when") or {}
        return {name: config.get(name) for name in self.landscape.grid if name in config or name not in conditional}
