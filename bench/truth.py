"""An independent stopwatch on the exported call: does what a study reports equal what the user's call gets?

For each case (a workload, a shape no other benchmark of the project uses) and each config -- with ``--study N``
the winner of an N-trial study the engine runs here (``sampler: auto``), as ``tuner export`` exports it; with
``--export`` the winners of exported studies; else the default space's first seeds that pass the static check --
in one run:

- ``reported``: what the study reported for it (the export's ``metrics``), or for a seed what a trial of it
  stores (``workload.run``: the workload's own stopwatch and metrics);
- ``eager``: :func:`triton.testing.do_bench` of the exported call as a user makes it (the workload's ``_launch``,
  exactly what a trial runs; L2 flushed before every call; launched from Python), its mean and median per round;
- ``graph``: :func:`triton.testing.do_bench_cudagraph` of the same call;
- ``host_us``: the host's time a call (calls back to back, no synchronization: the GPU's queue is deep enough
  that the host never waits), and a profile of the launcher's host path (``--profile-dir``);
- the library baseline (cuBLAS through ``torch.matmul``, the fastest SDPA backend, bf16 ``torch.matmul`` for the
  quantized products) timed the same ways, interleaved round by round with the tuned call.

The ``targets`` list compares reported with re-timed (``ratio`` = min / max, goal 0.95), the int4 M = 1 call with
bf16 (eager 2.0x, graph 2.5x) and each launcher family's host time (goal 10 us). Under the Triton interpreter
(no GPU) it runs a tiny shape with the CPU clock and marks every figure not comparable.

    PYTHONPATH=. python bench/truth.py --out bench/results/truth-h100.json
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/truth.py --tiny --out /tmp/truth-cpu.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import verdict, write_result

#: (name, workload, args, family): shapes no other benchmark, test or issue of the project uses.
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("gemm-4096x18944x3584", "triton_gemm", {"m": 4096, "n": 18944, "k": 3584}, "gemm"),
    ("gemm-2048x5120x13824", "triton_gemm", {"m": 2048, "n": 5120, "k": 13824}, "gemm"),
    ("gemm-6144x2560x10240", "triton_gemm", {"m": 6144, "n": 2560, "k": 10240}, "gemm"),
    ("attn-b1h28s3000d128-causal", "flash_attention",
     {"batch": 1, "heads": 28, "seq_len": 3000, "head_dim": 128, "causal": True}, "attention"),
    ("attn-b3h24s1792d64-full", "flash_attention",
     {"batch": 3, "heads": 24, "seq_len": 1792, "head_dim": 64, "causal": False}, "attention"),
    ("attn-b2h32s6144d128-causal", "flash_attention",
     {"batch": 2, "heads": 32, "seq_len": 6144, "head_dim": 128, "causal": True}, "attention"),
    ("quant-m1-3584x18944", "quant_gemm", {"m": 1, "n": 18944, "k": 3584}, "quant"),
    ("quant-m16-5120x13824", "quant_gemm", {"m": 16, "n": 13824, "k": 5120}, "quant"),
    ("quant-m64-2048x5632", "quant_gemm", {"m": 64, "n": 5632, "k": 2048}, "quant"),
]  # fmt: skip
#: The interpreter's case: one tiny GEMM, to show the harness runs (figures not comparable).
TINY_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("gemm-tiny", "triton_gemm", {"m": 32, "n": 32, "k": 32}, "gemm"),
]
HOST_GOAL_US = 10.0
AGREE_GOAL = 0.95


@dataclass
class Stopwatch:
    """The independent stopwatch: ``do_bench`` (eager) and ``do_bench_cudagraph`` on CUDA, the CPU clock elsewhere."""

    cuda: bool
    rep_ms: int = 100

    def eager(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Mean and median microseconds a call, L2 flushed before each (``do_bench``'s own flush)."""
        if not self.cuda:
            return _cpu_clock(fn)
        from triton.testing import do_bench

        mean = do_bench(fn, warmup=25, rep=self.rep_ms, return_mode="mean")
        med = do_bench(fn, warmup=5, rep=self.rep_ms, return_mode="median")
        return {"mean_us": mean * 1e3, "median_us": med * 1e3}

    def graph(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Microseconds a call in a CUDA graph of many calls (``do_bench_cudagraph``); empty on a CPU."""
        if not self.cuda:
            return {}
        import torch
        from triton.testing import do_bench_cudagraph

        with torch.cuda.stream(torch.cuda.Stream()):
            mean = do_bench_cudagraph(fn, rep=self.rep_ms, return_mode="mean")
        return {"mean_us": mean * 1e3}

    def host_us(self, fn: Callable[[], Any], calls: int = 200, rounds: int = 5) -> float:
        """The host's microseconds a call: ``calls`` calls without synchronizing, median of ``rounds`` loops (on a
        CPU three calls: the interpreter's call is the whole computation)."""
        if not self.cuda:
            calls, rounds = 3, 1
        samples = []
        for _ in range(rounds):
            self._sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) / calls * 1e6)
            self._sync()
        return statistics.median(samples)

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def _cpu_clock(fn: Callable[[], Any], reps: int = 3) -> dict[str, float]:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return {"mean_us": statistics.fmean(times), "median_us": statistics.median(times)}


def profile_text(fn: Callable[[], Any], calls: int = 300, top: int = 25) -> str:
    """cProfile of ``calls`` calls, the ``top`` entries by own time: where the launcher's host time goes."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(top)
    return buffer.getvalue()


@dataclass
class Case:
    """One case: the workload, its tensors and the calls to time (tuned configs and the library)."""

    name: str
    workload: Any
    family: str
    calls: dict[str, Callable[[], Any]] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)


def baseline_calls(workload: Any, family: str, case: Any) -> dict[str, Callable[[], Any]]:
    """The strongest library call a user would otherwise make, on the same tensors as the tuned call."""
    import torch

    if family == "gemm":
        from kernels.gemm.gemm import torch_matmul

        return {"cublas": lambda: torch_matmul(case.inputs)}
    if family == "attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(backend: Any) -> Callable[[], Any]:
            def call() -> Any:
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(
                        case.q, case.k, case.v, is_causal=workload.causal
                    )

            return call

        return {"sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    x = case.x.to(torch.bfloat16)
    weights = [torch.randn(workload.k, workload.n, device=x.device, dtype=torch.bfloat16)]
    copies = max(1, min(8, math.ceil(256 * 2**20 / weights[0].nbytes)))
    weights += [weights[0].clone() for _ in range(copies - 1)]
    turn = [0]

    def bf16() -> Any:
        turn[0] = (turn[0] + 1) % len(weights)
        return torch.matmul(x, weights[turn[0]])

    return {"bf16_matmul": bf16}


def pick_configs(workload: Any, device: Any, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` of the space's seeds that pass the static check on this device, one per kernel variant
    first (so that every launcher family's host time is measured), then the next seeds in order."""
    from tuner.study.space import compile_space

    space = compile_space(workload.space_document())
    feasible = [seed for seed in space.seeds if workload.static_check(seed, device) is None]
    firsts: dict[Any, dict[str, Any]] = {}
    for seed in feasible:
        firsts.setdefault(seed.get("kernel"), seed)
    picked = list(firsts.values())
    picked += [seed for seed in feasible if all(seed is not p for p in picked)]
    return picked[:count]


def study_export(workload_name: str, args: dict[str, Any], trials: int, name: str) -> dict[str, Any]:
    """Run an N-trial study of the case with the engine (its default search and remeasure) and return its export
    (``tuner export --format json``'s document)."""
    from bench.common import run_study
    from tuner.results.export import export_document
    from tuner.store.storage import StudyDB

    spec = {"name": f"truth-{name}", "workload": workload_name, "args": args,
            "objectives": [{"metric": "latency_ms"}], "budget": {"trials": trials}}  # fmt: skip
    path = str(Path(tempfile.mkdtemp()) / "study.db")
    run = run_study(spec, db_path=path, quiet=True)
    db = StudyDB(path)
    return export_document(db, db.get_study(run.summary.study_id))


def build_case(name: str, workload_name: str, args: dict[str, Any], family: str, device: Any,
               exported: list[dict[str, Any]], count: int) -> Case:  # fmt: skip
    """The workload, each config's reported result and its call, and the library's calls. An exported winner's
    reported figures are the export's; a seed's are those of a trial of it run here (``workload.run``)."""
    from tuner.workloads.base import TrialContext
    from tuner.workloads.registry import workload_class

    workload = workload_class(workload_name)(**args)
    case = Case(name, workload, family)
    tensors = None
    configs = [e["params"] for e in exported] or pick_configs(workload, device, count)
    for i, config in enumerate(configs):
        label = f"tuned{i}"
        if exported:
            case.reported[label] = {"status": "ok", "metrics": exported[i]["metrics"],
                                    "timing": exported[i].get("timing"), "trial": exported[i]["trial"]}  # fmt: skip
        else:
            result = workload.run(config, device, TrialContext(trial_number=i))
            case.reported[label] = {"status": result.status.value, "metrics": result.metrics,
                                    "timing": result.extra.get("timing"), "error": result.error}  # fmt: skip
            if not result.ok:
                continue
        trial_case = workload._case(config, device)
        tensors = tensors or trial_case
        case.configs[label] = config
        case.calls[label] = (lambda c=config, t=trial_case: workload._launch(c, t))
    if tensors is not None and device.is_gpu:
        case.calls.update(baseline_calls(workload, family, tensors))
    return case


def measure_case(case: Case, watch: Stopwatch, rounds: int, profile_dir: Path | None) -> dict[str, Any]:
    """Every call of the case timed round by round (A B C A B C ...), its host time and its profile."""
    eager: dict[str, list[dict[str, float]]] = {label: [] for label in case.calls}
    graph: dict[str, list[dict[str, float]]] = {label: [] for label in case.calls}
    for _ in range(rounds):
        for label, call in case.calls.items():
            eager[label].append(watch.eager(call))
            graph[label].append(watch.graph(call))
    calls: dict[str, Any] = {}
    for label, call in case.calls.items():
        calls[label] = {
            "eager_mean_us": _median_of(eager[label], "mean_us"),
            "eager_median_us": _median_of(eager[label], "median_us"),
            "graph_us": _median_of(graph[label], "mean_us"),
            "eager_rounds": eager[label],
            "graph_rounds": graph[label],
            "host_us": watch.host_us(call),
        }
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
            (profile_dir / f"{case.name}-{label}.txt").write_text(profile_text(call))
    return calls


def _median_of(rounds: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rounds if key in r and r[key] == r[key]]
    return statistics.median(values) if values else None


def reported_us(reported: dict[str, Any]) -> float | None:
    """The latency a trial reported, in microseconds (``latency_ms``, else the timing's median)."""
    metrics = reported.get("metrics") or {}
    if metrics.get("latency_ms") is not None:
        return float(metrics["latency_ms"]) * 1e3
    timing = reported.get("timing") or {}
    return float(timing["median_ms"]) * 1e3 if timing.get("median_ms") is not None else None


def case_targets(case: Case, calls: dict[str, Any]) -> list[dict[str, Any]]:
    """Reported vs re-timed (eager mean, the call as a user makes it) for each tuned config."""
    targets = []
    for label in case.configs:
        rep, got = reported_us(case.reported[label]), calls[label]["eager_mean_us"]
        ratio = min(rep, got) / max(rep, got) if rep and got else None
        targets.append({"target": f"{case.name} {label}: reported vs re-timed (eager, do_bench mean)",
                        "tuned": got, "baseline": rep, "ratio": ratio, "goal": AGREE_GOAL,
                        "verdict": verdict(ratio, AGREE_GOAL)})  # fmt: skip
    return targets


def speed_targets(case: Case, calls: dict[str, Any]) -> list[dict[str, Any]]:
    """The int4 M = 1 call against bf16 (eager >= 2.0x, graph >= 2.5x) and each call's host time."""
    targets = []
    bf16 = calls.get("bf16_matmul")
    for label, config in case.configs.items():
        mine = calls[label]
        if case.family == "quant" and case.workload.m == 1 and int(config.get("bits", 0)) == 4 and bf16:
            for mode, key, goal in (("eager", "eager_mean_us", 2.0), ("graph", "graph_us", 2.5)):
                ratio = bf16[key] / mine[key] if bf16.get(key) and mine.get(key) else None
                targets.append({"target": f"{case.name} {label}: int4 vs bf16 torch.matmul, {mode}",
                                "tuned": mine.get(key), "baseline": bf16.get(key), "ratio": ratio, "goal": goal,
                                "verdict": verdict(ratio, goal)})  # fmt: skip
        host = mine["host_us"]
        ratio = HOST_GOAL_US / host if host else None
        targets.append({"target": f"{case.name} {label} ({case.family}): host launch <= {HOST_GOAL_US:g} us",
                        "tuned": host, "baseline": HOST_GOAL_US, "ratio": ratio, "goal": 1.0,
                        "verdict": verdict(ratio, 1.0)})  # fmt: skip
    return targets


def load_exports(paths: list[str]) -> list[dict[str, Any]]:
    """Exported winners (``tuner export --format json``): each with ``workload``, ``spec.args`` and ``params``."""
    exports = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        exports.extend(data if isinstance(data, list) else [data])
    return exports


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="case names or families to run (default: all)")
    parser.add_argument("--export", nargs="*", default=[], help="exported winners (JSON) to check")
    parser.add_argument("--study", type=int, default=0, help="run an N-trial study per case and check its winner")
    parser.add_argument("--configs", type=int, default=2, help="seeds per case when no export is given")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the interpreter's tiny case (not comparable)")
    parser.add_argument("--profile-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from tuner.workloads.fingerprint import device_info

    device = device_info()
    watch = Stopwatch(cuda=device.is_gpu)
    exports = load_exports(args.export)
    results, targets = [], []
    for name, workload_name, wargs, family in TINY_CASES if args.tiny else CASES:
        if args.only and name not in args.only and family not in args.only:
            continue
        mine = [e for e in exports if e.get("workload") == workload_name and _args(e) == wargs]
        started = time.time()
        try:
            if args.study and not mine:
                mine = [study_export(workload_name, wargs, args.study, name)]
            case = build_case(name, workload_name, wargs, family, device, mine, args.configs)
            calls = measure_case(case, watch, args.rounds, Path(args.profile_dir) if args.profile_dir else None)
        except Exception as exc:  # one case's failure is reported, the others still run
            results.append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        targets += case_targets(case, calls) + speed_targets(case, calls)
        results.append({"case": name, "workload": workload_name, "args": wargs, "family": family,
                        "configs": case.configs, "reported": case.reported, "calls": calls,
                        "wall_s": round(time.time() - started, 1)})  # fmt: skip
        _print_case(name, case, calls)
        if args.out:  # what is done so far survives a run cut short
            Path(args.out).with_suffix(".partial.json").write_text(json.dumps(results, default=str))
    result = {"comparable": device.is_gpu, "device": device.name, "cases": results, "targets": targets,
              "summary": {t["target"]: t["verdict"] for t in targets}}  # fmt: skip
    write_result(result, args.out)
    return result


def _args(export: dict[str, Any]) -> dict[str, Any]:
    """An export's workload args without the defaults it may spell out (``timing: eager``)."""
    args = dict((export.get("spec") or {}).get("args") or {})
    if args.get("timing") == "eager":
        args.pop("timing")
    return args


def _print_case(name: str, case: Case, calls: dict[str, Any]) -> None:
    for label, c in calls.items():
        rep = reported_us(case.reported[label]) if label in case.reported else None
        print(f"{name:30s} {label:12s} reported {rep or float('nan'):9.1f}  eager mean {c['eager_mean_us'] or 0:9.1f}"
              f"  median {c['eager_median_us'] or 0:9.1f}  graph {c['graph_us'] or 0:9.1f}  host {c['host_us']:7.1f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
