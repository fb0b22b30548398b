"""The ``collective`` workload: one NCCL (or gloo) collective over the ranks of a multi-GPU trial.

A trial of ``world_size`` GPUs runs as ``world_size`` fresh processes that form a
``torch.distributed`` group for that trial only (:mod:`tuner.run.gang`), with the config's NCCL
knobs exported as environment variables before the communicator is created (NCCL reads them
then, several only once per process: a fresh process per trial is the honest way). The knobs
(``search_spaces/collective.yaml``) are ``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_MIN_NCHANNELS``,
``NCCL_MAX_NCHANNELS``, ``NCCL_BUFFSIZE`` and ``NCCL_NTHREADS``, each with a ``"default"``
choice meaning "unset: NCCL decides". On a CPU (gloo backend) they are recorded but inert.

The variables that keep NVLink multicast off (:data:`PROTECTED_ENV`: ``NCCL_NVLS_ENABLE=0`` and
the others the GPU machines set) are never overridden by a trial: the gang worker inherits them,
and :meth:`Collective.static_check` refuses a config that names them or picks an algorithm that
needs multicast (NVLS, NVLSTree) or a CollNet network plugin.

Args: ``op`` (all_reduce, reduce_scatter, all_gather), ``size_bytes`` (the nccl-tests "size": the
all-reduce buffer, the reduce-scatter input, the all-gather output), ``dtype`` (bf16, fp16, fp32),
``world_size`` (ranks; must equal the spec's ``resources.gpus_per_trial``), ``iters`` (timed
calls), ``warmup_iters`` (untimed calls first), ``timeout_s`` (the process-group timeout that ends
a hung collective; default from the study's ``trial_timeout_s``) and ``faults`` (injected by trial
number, on rank 1: ``hang`` sleeps instead of joining the collective so that rank 0 blocks in it
until the process-group timeout; ``die`` ends rank 1 with ``os._exit(7)``).

Numerics: rank ``r`` fills its input with ``(r + 1) * ((i % 7) + 1)`` (element ``i`` of the global
buffer): every sum is an integer <= 252, exact in bf16, so each rank compares its output exactly
with the expected values; the output is NaN-filled first (a launch that writes nothing fails).
The ranks then agree (a MAX all-reduce of a flag) so that none goes on to the timed calls alone.

Timing: :func:`tuner.workloads.measure.time_fn` with a fixed count (``iters`` repetitions, no adaptive rounds:
every rank must make the same number of calls) and no L2 flush, after ``warmup_iters`` untimed
calls and a barrier. Each rank takes the median of its samples; the slowest rank's median
(a MAX all-reduce) is the latency. Metrics follow nccl-tests: ``algbw = size_bytes / latency``,
``busbw = algbw * 2(n-1)/n`` for all_reduce and ``algbw * (n-1)/n`` for reduce_scatter and
all_gather (GB/s = 1e9 bytes/s); ``latency_us``.

torch is imported inside the methods: the registry, ``__init__`` and ``static_check`` stay light.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tuner.workloads.base import DeviceInfo, MetricSpec, comment_text, is_pow2
from tuner.workloads.rank import RankWorkload, agree_on_failure, slowest
from tuner.workloads.template import Checked

if TYPE_CHECKING:
    from tuner.workloads.measure import Timing

OPS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather")
#: dtype arg -> (torch dtype attribute, bytes per element, roofline precision)
DTYPES: dict[str, tuple[str, int, str]] = {
    "bf16": ("bfloat16", 2, "bf16"),
    "fp16": ("float16", 2, "fp16"),
    "fp32": ("float32", 4, "fp32"),
}
#: The NCCL environment variables a config may set ("default" = unset).
NCCL_KNOBS: tuple[str, ...] = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
)
DEFAULT = "default"
#: Variables that keep NVLink multicast off on the GPU machines: inherited, never set by a trial.
PROTECTED_ENV: tuple[str, ...] = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
ALGOS: tuple[str, ...] = ("Ring", "Tree")
#: Algorithms NCCL knows but a trial may not pick, with the reason.
REFUSED_ALGOS: dict[str, str] = {
    "nvls": "NVLS uses NVLink multicast, which must stay off (NCCL_NVLS_ENABLE=0)",
    "nvlstree": "NVLSTree uses NVLink multicast, which must stay off (NCCL_NVLS_ENABLE=0)",
    "collnetdirect": "CollnetDirect needs a CollNet network plugin (SHARP), absent on a single node",
    "collnetchain": "CollnetChain needs a CollNet network plugin (SHARP), absent on a single node",
    "collnet": "CollNet needs a network plugin (SHARP), absent on a single node",
    "pat": "PAT runs with one GPU per node only, never within one node",
}
PROTOS: tuple[str, ...] = ("LL", "LL128", "Simple")
NTHREADS: tuple[int, ...] = (64, 128, 256, 512)
MAX_CHANNELS = 64
FAULTS: tuple[str, ...] = ("hang", "die")
#: Busbw factor of each op over n ranks (nccl-tests' PERFORMANCE.md).
BUS_FACTOR: dict[str, Any] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}
#: NCCL tuner-plugin names (ext-tuner/example's nccl_tuner.conf) of the ops.
TUNER_COLL_NAMES: dict[str, str] = {
    "all_reduce": "allreduce",
    "reduce_scatter": "reducescatter",
    "all_gather": "allgather",
}


def _int_arg(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def parse_faults(faults: dict[str | int, str] | None, known: tuple[str, ...] = FAULTS) -> dict[int, str]:
    """``{"3": "hang"}`` -> ``{3: "hang"}``; ValueError naming ``faults`` for unknown kinds or keys."""
    if faults is None:
        return {}
    if not isinstance(faults, dict):
        raise ValueError(f"faults must be a mapping of trial number -> fault, got {faults!r}")
    out: dict[int, str] = {}
    for key, kind in faults.items():
        if kind not in known:
            raise ValueError(f"faults.{key}: unknown fault {kind!r}; known: {', '.join(known)}")
        try:
            out[int(key)] = kind
        except ValueError:
            raise ValueError(f"faults.{key}: keys are trial numbers") from None
    return out


def nccl_static_check(config: dict[str, Any], op: str | None = None) -> str | None:
    """Why the NCCL knobs of ``config`` are refused, or None. Cheap: no torch, no GPU."""
    for key in config:
        if key.upper() in PROTECTED_ENV:
            return f"{key} keeps NVLink multicast off and is never set by a trial"
    algo = config.get("NCCL_ALGO", DEFAULT)
    if algo != DEFAULT:
        names = [part.strip() for part in str(algo).lstrip("^").split(",")]
        for name in names:
            reason = REFUSED_ALGOS.get(name.lower())
            if reason is not None:
                return f"NCCL_ALGO={algo}: {reason}"
        if str(algo).startswith("^") or len(names) != 1 or algo not in ALGOS:
            return f"NCCL_ALGO must be one of {', '.join((DEFAULT, *ALGOS))}, got {algo!r}"
        if algo == "Tree" and op is not None and op != "all_reduce":
            return f"NCCL_ALGO=Tree: NCCL implements Tree for all_reduce only, not {op}"
    proto = config.get("NCCL_PROTO", DEFAULT)
    if proto != DEFAULT and proto not in PROTOS:
        return f"NCCL_PROTO must be one of {', '.join((DEFAULT, *PROTOS))}, got {proto!r}"
    channels = {}
    for key in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
        value = config.get(key, DEFAULT)
        if value == DEFAULT:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHANNELS:
            return f"{key} must be {DEFAULT!r} or an int in [1, {MAX_CHANNELS}], got {value!r}"
        channels[key] = value
    if len(channels) == 2 and channels["NCCL_MIN_NCHANNELS"] > channels["NCCL_MAX_NCHANNELS"]:
        return (
            f"NCCL_MIN_NCHANNELS={channels['NCCL_MIN_NCHANNELS']} exceeds "
            f"NCCL_MAX_NCHANNELS={channels['NCCL_MAX_NCHANNELS']}"
        )
    buffsize = config.get("NCCL_BUFFSIZE", DEFAULT)
    if buffsize != DEFAULT and (isinstance(buffsize, bool) or not isinstance(buffsize, int) or not is_pow2(buffsize)):
        return f"NCCL_BUFFSIZE must be {DEFAULT!r} or a power of two (bytes), got {buffsize!r}"
    threads = config.get("NCCL_NTHREADS", DEFAULT)
    if threads != DEFAULT and threads not in NTHREADS:
        return f"NCCL_NTHREADS must be {DEFAULT!r} or one of {NTHREADS}, got {threads!r}"
    return None


def nccl_env(config: dict[str, Any]) -> dict[str, str | None]:
    """The environment of a trial's rank processes: each NCCL knob -> its value, or None (unset it)."""
    return {key: (None if config.get(key, DEFAULT) == DEFAULT else str(config[key])) for key in NCCL_KNOBS}


def set_nccl_env(config: dict[str, Any]) -> dict[str, str]:
    """Only the NCCL variables the config sets (``format=env`` export)."""
    return {key: value for key, value in nccl_env(config).items() if value is not None}


@dataclass
class _Case:
    """One trial's buffers on one rank."""

    op: str
    inp: Any
    out: Any
    expected: Any
    rank: int
    world_size: int
    device: Any  # torch.device
    fault: str | None = None


class Collective(RankWorkload):
    """One collective (all-reduce, reduce-scatter, all-gather) under one setting of the NCCL knobs."""

    name: ClassVar[str] = "collective"
    shape_args: ClassVar[tuple[str, ...]] = ("op", "size_bytes", "world_size")
    shape_exact: ClassVar[tuple[str, ...]] = ("world_size",)
    unkeyed_args: ClassVar[tuple[str, ...]] = ("iters", "warmup_iters", "timeout_s", "faults")
    space_file: ClassVar[str] = "collective.yaml"
    description: ClassVar[str] = (
        "NCCL collective (all_reduce/reduce_scatter/all_gather) over a multi-GPU trial: NCCL_ALGO, NCCL_PROTO, "
        "channels, buffer size, threads"
    )
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(
            "busbw_gbps", "maximize", "GB/s", "nccl-tests bus bandwidth: algbw * 2(n-1)/n (all_reduce), (n-1)/n"
        ),
        MetricSpec("algbw_gbps", "maximize", "GB/s", "size_bytes / latency"),
        MetricSpec("latency_us", "minimize", "us", "median time of one collective on the slowest rank"),
    )

    def __init__(
        self,
        op: str = "all_reduce",
        size_bytes: int = 16 * 2**20,
        dtype: str = "bf16",
        world_size: int = 2,
        iters: int = 20,
        warmup_iters: int = 5,
        timeout_s: float | None = None,
        faults: dict[str | int, str] | None = None,
    ) -> None:
        super().__init__()
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.op, self.dtype = op, dtype
        self.world_size = _int_arg("world_size", world_size, 1)
        if self.world_size > 8:
            raise ValueError(f"world_size must be <= 8 (the GPUs of one node), got {world_size}")
        self.size_bytes = _int_arg("size_bytes", size_bytes, 1)
        unit = DTYPES[dtype][1] * self.world_size
        if self.size_bytes % unit:
            raise ValueError(f"size_bytes must be a multiple of {unit} (element size * world_size), got {size_bytes}")
        self.iters = _int_arg("iters", iters, 1)
        self.warmup_iters = _int_arg("warmup_iters", warmup_iters, 0)
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600
        ):
            raise ValueError(f"timeout_s must be a number in (0, 3600] or null, got {timeout_s!r}")
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.faults = parse_faults(faults)

    @property
    def elements(self) -> int:
        """Elements of the full buffer (``size_bytes`` / element size)."""
        return self.size_bytes // DTYPES[self.dtype][1]

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        return nccl_static_check(config, self.op)

    def trial_env(self, config: dict[str, Any]) -> dict[str, str | None]:
        """The NCCL knobs of ``config`` for the rank processes (None = unset: NCCL decides)."""
        return nccl_env(config)

    # ------------------------------------------------------------------ one trial (the template's hooks)

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """Rank ``rank``'s input, its output and the exact expected output."""
        import torch
        import torch.distributed as dist

        rank, n = dist.get_rank(), dist.get_world_size()
        torch_device = torch.device("cuda", torch.cuda.current_device()) if device.is_gpu else torch.device("cpu")
        dtype = getattr(torch, DTYPES[self.dtype][0])
        total = self.elements
        chunk = total // n
        base = (torch.arange(total, device=torch_device) % 7 + 1).to(dtype)
        ranks_sum = n * (n + 1) // 2
        if self.op == "all_reduce":
            inp = base * (rank + 1)
            out = torch.empty(total, dtype=dtype, device=torch_device)
            expected = base * ranks_sum
        elif self.op == "reduce_scatter":
            inp = base * (rank + 1)
            out = torch.empty(chunk, dtype=dtype, device=torch_device)
            expected = base[rank * chunk : (rank + 1) * chunk] * ranks_sum
        else:
            inp = base[rank * chunk : (rank + 1) * chunk] * (rank + 1)
            out = torch.empty(total, dtype=dtype, device=torch_device)
            owner = torch.arange(total, device=torch_device) // chunk + 1
            expected = base * owner.to(dtype)
        fault = self.faults.get(self.trial_ctx.trial_number) if rank == 1 else None
        return _Case(self.op, inp.contiguous(), out, expected, rank, n, torch_device, fault)

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """The checked collective (after an injected fault): writes the reduced/gathered values into ``case.out``."""
        inject_fault(case.fault)
        if case.op == "all_reduce":
            case.out.copy_(case.inp)
        _collective(case.op, case.out, case.inp)

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        """This rank's exact comparison, then the ranks agree, so that none goes on to the timed calls alone."""
        import torch.distributed as dist

        error = self._compare(case)
        others = agree_on_failure(error is not None, case.device)
        if error is not None or others:
            return Checked({}, failure=error or "another rank's output was wrong")
        return Checked({}, extra={"world_size": case.world_size, "backend": dist.get_backend()})

    def _time(self, config: dict[str, Any], case: _Case, device: DeviceInfo, comparable: bool) -> Timing:
        """``warmup_iters`` untimed calls, a barrier, then exactly ``iters`` timed calls on every rank."""
        import torch.distributed as dist

        from tuner.workloads.measure import time_fn

        case.expected = None
        if case.op == "all_reduce":
            case.out.zero_()  # timed in place: zeros stay zeros, no overflow over the repetitions

            def call() -> None:
                dist.all_reduce(case.out)
        else:

            def call() -> None:
                _collective(case.op, case.out, case.inp)

        for _ in range(self.warmup_iters):
            call()
        dist.barrier()
        return time_fn(
            call, device, warmup_ms=0.0, rep_ms=0.0, min_reps=self.iters, max_reps=self.iters, flush_l2=False
        )

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        """nccl-tests' bandwidths of the slowest rank's median."""
        latency_ms = slowest(median_ms, case.device)
        algbw = self.size_bytes / (latency_ms * 1e-3) / 1e9 if latency_ms > 0 else math.inf
        return {
            "busbw_gbps": algbw * BUS_FACTOR[self.op](case.world_size),
            "algbw_gbps": algbw,
            "latency_us": latency_ms * 1e3,
            "latency_ms": latency_ms,
        }

    @staticmethod
    def _compare(case: _Case) -> str | None:
        import torch

        out = case.out
        if not bool(torch.isfinite(out).all()):
            bad = int((~torch.isfinite(out)).sum())
            return f"rank {case.rank}: {bad} of {out.numel()} outputs are NaN/inf"
        if not torch.equal(out, case.expected):
            wrong = int((out != case.expected).sum())
            err = float((out.float() - case.expected.float()).abs().max())
            return f"rank {case.rank}: {wrong} of {out.numel()} outputs differ from the exact sum (max error {err})"
        return None

    # ------------------------------------------------------------------ exports and work

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """One operation per output element (the adds of a reduction, a copy for all_gather) and the bytes a
        rank must at least read and write (its input and output). Collectives are bound by the links,
        not by HBM or FLOPs: the roofline position is only indicative."""
        n = self.world_size
        outputs = self.elements // n if self.op == "reduce_scatter" else self.elements
        inputs = self.elements // n if self.op == "all_gather" else self.elements
        element = DTYPES[self.dtype][1]
        return float(outputs), float((inputs + outputs) * element), DTYPES[self.dtype][2]

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"op": self.op, "size_bytes": self.size_bytes, "dtype": self.dtype, "env": set_nccl_env(config)}

    def export_env(self, config: dict[str, Any]) -> dict[str, str]:
        """Only the NCCL variables the config sets ("default" knobs are left to NCCL)."""
        return set_nccl_env(config)

    def export_python(self, config: dict[str, Any]) -> str:
        env = set_nccl_env(config)
        header = comment_text(f"collective {self.op}, {self.size_bytes} bytes {self.dtype}, {self.world_size} ranks")
        return (
            f"# {header}\n"
            "import os\n\n"
            "# set before torch.distributed.init_process_group: NCCL reads them when the communicator is created\n"
            f"os.environ.update({env!r})\n"
        )

    # ``tuner collective-table`` reaches these through the workload registry (tuner imports no workload).
    @staticmethod
    def table_from_db(db: Any, studies: list[str] | None = None) -> list[dict[str, Any]]:
        """:func:`size_table_from_db`."""
        return size_table_from_db(db, studies)

    @staticmethod
    def render_table(rows: list[dict[str, Any]], fmt: str) -> str:
        """:func:`render_size_table`."""
        return render_size_table(rows, fmt)


# ---------------------------------------------------------------------------------------- helpers shared with ddp_step


def _collective(op: str, out: Any, inp: Any) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(out)
    elif op == "reduce_scatter":
        # torch 2.13 renames reduce_scatter_tensor / all_gather_into_tensor (same arguments); 2.11 has the old names
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp)
    else:
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp)


def inject_fault(fault: str | None) -> None:
    """``hang``: never join the next collective (the other ranks block in it); ``die``: exit at once."""
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "die":
        os._exit(7)


def size_table(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chosen NCCL setting per message-size range, from the winners of several collective studies.

    ``entries``: one per study, ``{"study", "op", "dtype", "size_bytes", "world_size", "params", "metrics"}``.
    Per (op, dtype, world_size) the measured sizes are sorted and each one owns the range from the
    geometric midpoint with its smaller neighbour (0 for the smallest) to the midpoint with its larger
    neighbour (inclusive; -1 = no upper bound for the largest), as NCCL's example tuner plugin reads
    ``min_bytes,max_bytes``. Returns rows ``{"op", "dtype", "world_size", "min_bytes", "max_bytes",
    "size_bytes", "algorithm", "protocol", "channels", "env", "study", "busbw_gbps"}`` ("default" where
    the winner left a knob to NCCL; channels = NCCL_MAX_NCHANNELS, else -1).
    """
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for entry in entries:
        key = (entry["op"], entry["dtype"], int(entry.get("world_size") or 0))
        groups.setdefault(key, []).append(entry)
    rows: list[dict[str, Any]] = []
    for (op, dtype, world_size), members in sorted(groups.items()):
        members = sorted(members, key=lambda e: e["size_bytes"])
        sizes = [int(e["size_bytes"]) for e in members]
        for i, entry in enumerate(members):
            low = 0 if i == 0 else int(math.sqrt(sizes[i - 1] * sizes[i])) + 1
            high = -1 if i == len(members) - 1 else int(math.sqrt(sizes[i] * sizes[i + 1]))
            params = entry.get("params") or {}
            channels = params.get("NCCL_MAX_NCHANNELS", DEFAULT)
            rows.append(
                {
                    "op": op,
                    "dtype": dtype,
                    "world_size": world_size,
                    "min_bytes": low,
                    "max_bytes": high,
                    "size_bytes": sizes[i],
                    "algorithm": params.get("NCCL_ALGO", DEFAULT),
                    "protocol": params.get("NCCL_PROTO", DEFAULT),
                    "channels": -1 if channels == DEFAULT else int(channels),
                    "env": set_nccl_env(params),
                    "study": entry.get("study"),
                    "busbw_gbps": (entry.get("metrics") or {}).get("busbw_gbps"),
                }
            )
    return rows


def size_table_from_db(db: Any, studies: list[str] | None = None) -> list[dict[str, Any]]:
    """:func:`size_table` of the default picks of the ``collective`` studies in ``db`` (all, or those named)."""
    from tuner.results.export import ExportError, export_document

    rows = db.list_studies()
    chosen = [r for r in rows if r.workload == "collective" and (studies is None or r.name in studies)]
    if studies is not None:
        missing = sorted(set(studies) - {r.name for r in chosen})
        if missing:
            raise ExportError(f"no collective studies named {missing}")
    entries = []
    for row in chosen:
        try:
            document = export_document(db, row)
        except ExportError:
            continue  # no successful trial yet: no row
        args = row.spec.get("args", {})
        workload = Collective(**args)
        entries.append(
            {
                "study": row.name,
                "op": workload.op,
                "dtype": workload.dtype,
                "size_bytes": workload.size_bytes,
                "world_size": workload.world_size,
                "params": document["params"],
                "metrics": document["metrics"],
            }
        )
    return size_table(entries)


def render_size_table(rows: list[dict[str, Any]], fmt: str) -> str:
    """``json``: the rows; ``csv``: NCCL's example tuner plugin file (``nccl_tuner.conf``):
    ``collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff``.
    A range whose winner left the algorithm or the protocol to NCCL becomes a comment line."""
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt != "csv":
        raise ValueError(f"format must be json or csv, got {fmt!r}")
    lines = [
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff",
        "# written by the tuner from collective studies (one per message size)",
    ]
    for row in rows:
        fields = [
            TUNER_COLL_NAMES[row["op"]],
            str(row["min_bytes"]),
            str(row["max_bytes"]),
            str(row["algorithm"]).lower(),
            str(row["protocol"]).lower(),
            str(row["channels"]),
            "1",
            str(row["world_size"] or -1),
            "-1",
            "-1",
        ]
        line = ",".join(fields)
        if DEFAULT in (row["algorithm"], row["protocol"]):
            line = f"# {line}  (study {row['study']}: NCCL's own choice kept)"
        lines.append(line)
    return "\n".join(lines) + "\n"
