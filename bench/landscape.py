"""Record an exhaustive landscape: every config of a fixed grid, failures included, with raw samples.

Writes JSON Lines (the format :mod:`objectives.replay` reads): a header with the
fingerprint, the workload, its args, the grid and the metrics, then one object per
config with ``params``, ``status``, ``metrics``, ``samples`` (ms) and ``error``, plus the
SM clock and temperature after it. Configs the engine would prune statically (the default space's
rules, the workload's ``static_check``) are recorded as ``infeasible_static`` without running.
Kernels are compiled ahead on a thread pool
(``Workload.prepare``) while the GPU times earlier configs, as the engine's workers do.

    python bench/landscape.py gemm --out bench/landscapes/gemm-bf16-fp16-4096.jsonl

A family's ``when`` gives conditional params their condition, as the workload's space does (the
persistent GEMM's ``EPILOGUE_SUBTILE`` exists only for ``kernel != 'tutorial'``): a config records
only its active params, once, and the header carries the conditions for the replay space.

A large grid is recorded within a GPU-time budget: ``--order random`` visits the grid in a seeded
random order, short timing (``--warmup-ms``, ``--rep-ms``, ``--max-time-ms``), and ``--time-limit-s``
stops starting configs after that many seconds: the file then holds a uniform random subset of the
grid, and its header is rewritten with ``configs_recorded`` and ``truncated``.

The ``replay`` workload then answers studies from the file on any machine:
``{"workload": "replay", "args": {"file": "bench/landscapes/gemm-bf16-fp16-4096.jsonl"}}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import itertools
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: The grid of each family: the workload, its args and the values of every knob (>= 300 configs).
_GEMM_WHEN = {
    "EPILOGUE_SUBTILE": "kernel != 'tutorial'",
    "FP8_FAST_ACCUM": "kernel != 'tutorial' and precision == 'fp8'",
}
GRIDS: dict[str, dict[str, Any]] = {
    # The default GEMM space at an LLM shape (an 8B model's MLP up-projection over 4096 tokens): every
    # precision, the three kernel variants; 3,240 grid points, 2,700 distinct configs before the rules.
    "gemm_llm": {
        "workload": "triton_gemm",
        "args": {"m": 4096, "n": 14336, "k": 4096},
        "grid": {
            "BLOCK_M": [64, 128, 256],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [32, 64, 128],
            "GROUP_M": [8],
            "num_warps": [4, 8],
            "num_stages": [3, 4],
            "precision": ["fp32", "tf32", "bf16", "fp16", "fp8"],
            "pad_k": [False],
            "kernel": ["tutorial", "persistent_tma", "persistent_tma_ws"],
            "EPILOGUE_SUBTILE": [False, True],
            "FP8_FAST_ACCUM": [True],
        },
        "when": _GEMM_WHEN,
    },
    # The default attention space in full (three kernels, their conditional knobs) at an LLM prefill:
    # batch 4, 32 heads, 4096 tokens, head_dim 128, causal; 2,400 distinct configs before the rules.
    "attention_llm": {
        "workload": "flash_attention",
        "args": {"batch": 4, "heads": 32, "seq_len": 4096, "head_dim": 128, "causal": True},
        "grid": {
            "BLOCK_M": [32, 64, 128, 256],
            "BLOCK_N": [16, 32, 64, 128, 256],
            "num_warps": [4, 8],
            "num_stages": [1, 2, 3, 4, 5],
            "precision": ["bf16", "fp16"],
            "kernel": ["tutorial", "persistent_tma", "persistent_tma_ws"],
            "use_tma": [False, True],
            "SPLIT_M": [False, True],
        },
        "when": {"use_tma": "kernel == 'tutorial'", "SPLIT_M": "kernel != 'tutorial'"},
    },
    # The quantized GEMM at M = 1 (one decode token) on an 8192 x 8192 layer: int4 and int8, the tile,
    # split-K, warps and stages of the default space; 2,250 configs before the rules.
    "quant_gemm_m1": {
        "workload": "quant_gemm",
        "args": {"m": 1, "n": 8192, "k": 8192},
        "grid": {
            "bits": [4, 8],
            "group_size": [128],
            "precision": ["bf16"],
            "BLOCK_M": [1],
            "BLOCK_N": [16, 32, 64, 128, 256],
            "BLOCK_K": [16, 32, 64, 128, 256],
            "SPLIT_K": [1, 2, 4, 8, 16],
            "num_warps": [2, 4, 8],
            "num_stages": [2, 3, 4],
        },
    },
    "gemm": {
        "workload": "triton_gemm",
        "args": {"m": 4096, "n": 4096, "k": 4096},
        "grid": {
            "BLOCK_M": [64, 128, 256],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [32, 64, 128],
            "GROUP_M": [8],
            "num_warps": [4, 8],
            "num_stages": [3, 4, 5],
            "precision": ["bf16", "fp16"],
        },
    },
    # Every precision of the tutorial GEMM at 4096^3 (fp32 IEEE, tf32, bf16, fp16, fp8 e4m3): the landscape whose
    # TFLOP/s-vs-error front has a point per precision that pays off, for the demo on machines without a GPU.
    "gemm_precisions": {
        "workload": "triton_gemm",
        "args": {"m": 4096, "n": 4096, "k": 4096},
        "grid": {
            "BLOCK_M": [64, 128],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [32, 64, 128],
            "GROUP_M": [8],
            "num_warps": [4, 8],
            "num_stages": [3, 4],
            "precision": ["fp32", "tf32", "bf16", "fp16", "fp8"],
            "pad_k": [False],
            "kernel": ["tutorial"],
        },
    },
    # The persistent TMA GEMM kernels (kernels/gemm/gemm_tma.py) at the 8192^3 target shape, bf16.
    "gemm_tma": {
        "workload": "triton_gemm",
        "args": {"m": 8192, "n": 8192, "k": 8192},
        "grid": {
            "BLOCK_M": [64, 128],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [32, 64, 128],
            "GROUP_M": [8],
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4, 5],
            "precision": ["bf16"],
            "pad_k": [False],
            "kernel": ["persistent_tma", "persistent_tma_ws"],
            "EPILOGUE_SUBTILE": [False, True],
        },
    },
    # The persistent TMA attention kernels (kernels/attention/attention_persistent.py): B*S = 16384, H*D = 2048, causal.
    "attention_persistent": {
        "workload": "flash_attention",
        "args": {"batch": 4, "heads": 16, "seq_len": 4096, "head_dim": 128, "causal": True},
        "grid": {
            "BLOCK_M": [64, 128, 256],
            "BLOCK_N": [32, 64, 128],
            "num_warps": [4, 8],
            "num_stages": [1, 2, 3, 4],
            "precision": ["bf16", "fp16"],
            "kernel": ["persistent_tma", "persistent_tma_ws"],
            "SPLIT_M": [False, True],
        },
    },
    # The Gluon warp-specialized attention (kernels/attention/attention_ws.py, kernel gluon_ws) at D=64, where every
    # consumer count and stage count fits: S=2048 causal, B*S = 16384, H*D = 2048; 864 configs (PINGPONG only
    # with OVERLAP).
    "attention_ws": {
        "workload": "flash_attention",
        "args": {"batch": 8, "heads": 32, "seq_len": 2048, "head_dim": 64, "causal": True},
        "grid": {
            "BLOCK_M": [128],
            "BLOCK_N": [64, 128],
            "num_warps": [4],
            "num_stages": [2, 3, 4],
            "precision": ["bf16"],
            "kernel": ["gluon_ws"],
            "OVERLAP": [False, True],
            "PINGPONG": [False, True],
            "PERSISTENT": [False, True],
            "CONSUMERS": [2, 3],
            "ONE_LOOP": [False, True],
            "EPILOGUE": [0, 1, 2],
            "RELEASE_K": [False, True],
        },
        "when": {"PINGPONG": "kernel == 'gluon_ws' and OVERLAP"},
    },
    "attention": {
        "workload": "flash_attention",
        "args": {"batch": 4, "heads": 16, "seq_len": 4096, "head_dim": 128, "causal": False},
        "grid": {
            "BLOCK_M": [32, 64, 128, 256],
            "BLOCK_N": [16, 32, 64, 128],
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4, 5],
            "precision": ["bf16", "fp16"],
            "use_tma": [False, True],
        },
    },
    "quant_gemm": {
        "workload": "quant_gemm",
        "args": {"m": 16, "n": 8192, "k": 8192},
        "grid": {
            "bits": [4, 8],
            "group_size": [128],
            "precision": ["bf16"],
            "BLOCK_M": [16],
            "BLOCK_N": [32, 64, 128, 256],
            "BLOCK_K": [64, 128, 256],
            "SPLIT_K": [1, 2, 4, 8],
            "num_warps": [2, 4, 8],
            "num_stages": [3, 4],
        },
    },
    # Every bits x group size x activation precision of the quantized GEMM at M = 16: the landscape whose
    # TFLOP/s-vs-error front has many points (each finer group or wider weight buys accuracy with speed), for
    # the demo on machines without a GPU; 432 configs before the rules. The committed recording
    # (bench/landscapes/quant_groups-m16-8192.jsonl, whose header holds its own grid) also has group 256,
    # which the default space does not offer: it was recorded before this grid was aligned with the space.
    "quant_groups": {
        "workload": "quant_gemm",
        "args": {"m": 16, "n": 8192, "k": 8192},
        "grid": {
            "bits": [4, 8],
            "group_size": [32, 64, 128],
            "precision": ["bf16", "fp16"],
            "BLOCK_M": [16],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [64, 128],
            "SPLIT_K": [1, 2, 4],
            "num_warps": [4],
            "num_stages": [3, 4],
        },
    },
    # Decode batch 64, where the quantized GEMM misses its target: row tiles 32 and 64, split-K up to 16,
    # plain and swapped products.
    "quant_gemm_m64": {
        "workload": "quant_gemm",
        "args": {"m": 64, "n": 8192, "k": 8192},
        "grid": {
            "bits": [4, 8],
            "group_size": [128],
            "precision": ["bf16"],
            "BLOCK_M": [32, 64],
            "BLOCK_N": [64, 128, 256],
            "BLOCK_K": [64, 128],
            "SPLIT_K": [2, 4, 8, 16],
            "num_warps": [4, 8],
            "num_stages": [3],
            "SWAP_AB": [0, 1],
        },
    },
    **{
        family: {
            "workload": family,
            "args": {"rows": 8192, "cols": 8192},
            "grid": {
                "BLOCK": [1024, 2048, 4096, 8192, 16384],
                "ROWS_PER_PROGRAM": [1, 2, 4, 8],
                "num_warps": [1, 2, 4, 8, 16, 32],
                "num_stages": [1, 2],
                "precision": ["bf16", "fp16"],
            },
        }
        for family in ("rmsnorm", "softmax")
    },
}


def grid_configs(grid: dict[str, list[Any]], when: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the grid's order (the last param varies fastest); with
    ``when``, a conditional param is left out of a config where its condition fails (the config kept once)."""
    from tuner.study import expr

    names = list(grid)
    conditions = {name: expr.parse(text, allow_calls=False) for name, text in (when or {}).items()}
    out: dict[str, dict[str, Any]] = {}
    for values in itertools.product(*(grid[n] for n in names)):
        config: dict[str, Any] = {}
        for name, value in zip(names, values, strict=True):
            condition = conditions.get(name)
            try:
                active = condition is None or bool(condition.evaluate(config))
            except expr.ExpressionError:
                active = False
            if active:
                config[name] = value
        out.setdefault(json.dumps(config, sort_keys=True), config)
    return list(out.values())


def _header(
    workload_name: str,
    args: dict[str, Any],
    grid: dict[str, list[Any]],
    workload: Any,
    configs: int,
    when: dict[str, str] | None,
    order_seed: int | None,
) -> dict[str, Any]:
    """The landscape's first line: what was run, in what order, on what machine."""
    from tuner.workloads.fingerprint import fingerprint

    return {
        "kind": "landscape",
        "format": 1,
        "workload": workload_name,
        "args": args,
        "grid": grid,
        "configs": configs,
        **({"when": when} if when else {}),
        "order": "grid order" if order_seed is None else f"seeded random order (seed {order_seed})",
        "pruning": "the default space's rules, then the workload's static_check: infeasible_static, not run",
        "metrics": [
            {"name": m.name, "direction": m.direction, "unit": m.unit, "description": m.description}
            for m in workload.metric_specs()
        ],
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": _command(),
        "fingerprint": fingerprint(),
    }


def _record(workload: Any, config: dict[str, Any], reason: str | None, i: int, device: Any) -> dict[str, Any]:
    """One config's line: infeasible without a launch, or run once (its exception classified)."""
    from tuner.workloads.base import TrialContext, TrialResult, TrialStatus
    from tuner.workloads.failures import classify_exception
    from tuner.workloads.roofline import gpu_clock_and_temperature

    if reason is not None:
        result = TrialResult(TrialStatus.INFEASIBLE_STATIC, error=reason)
    else:  # its compile, ahead, has finished
        try:
            result = workload.run(config, device, TrialContext(trial_number=i))
        except Exception as exc:
            result = TrialResult(classify_exception(exc), error=traceback.format_exc()[-2000:])
    return {
        "params": config,
        "status": result.status.value,
        "metrics": {k: (v if v == v and abs(v) != float("inf") else None) for k, v in result.metrics.items()},
        "samples": [round(s, 6) for s in result.samples_ms],
        "error": (result.error or None) and result.error[-1000:],
        "telemetry": gpu_clock_and_temperature() if device.is_gpu else {},
    }


def record_landscape(
    workload_name: str,
    args: dict[str, Any],
    grid: dict[str, list[Any]],
    out: Path,
    *,
    compile_threads: int = 8,
    limit: int | None = None,
    when: dict[str, str] | None = None,
    order_seed: int | None = None,
    time_limit_s: float | None = None,
    compile_procs: int = 0,
) -> dict[str, int]:
    """Run every config of ``grid`` on this process's device and write the landscape to ``out``.

    Returns the count of each status. Each record is flushed as it is written, so an
    interrupted run leaves a readable prefix. ``order_seed``: visit the configs in that seeded random
    order; ``time_limit_s``: start no config after that many seconds (the header then says how many were
    recorded); ``compile_procs``: compile in that many processes ahead of the timing thread.
    """
    import random

    from tuner.study.space import compile_space
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.registry import workload_class

    workload = workload_class(workload_name)(**args)
    device = device_info()
    configs = grid_configs(grid, when)
    if order_seed is not None:
        random.Random(order_seed).shuffle(configs)
    configs = configs[:limit]
    header = _header(workload_name, args, grid, workload, len(configs), when, order_seed)
    counts: dict[str, int] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=compile_threads)
    # The engine's static pruning: the default space's rules, then the workload's own check. A config a
    # study would never run (a register tile that spills, say) is recorded, not compiled.
    space = compile_space(workload.space_document())
    reasons = [space.static_violation(c, device.to_dict()) or workload.static_check(c, device) for c in configs]
    # Compile ahead: every feasible config is submitted at once; the pool works through them while
    # the main thread times, in order, those already compiled. With ``compile_procs``, processes compile
    # first (Triton's front end holds the GIL, so threads alone compile about one kernel at a time) and
    # the thread's prepare then loads the kernel from Triton's on-disk cache.
    feasible = [i for i in range(len(configs)) if reasons[i] is None]
    procs, ahead = _ahead_compiles(workload_name, args, [configs[i] for i in feasible], compile_procs)
    prepared = {
        i: pool.submit(_prepare_after, ahead.get(n), workload, configs[i], device) for n, i in enumerate(feasible)
    }
    start = time.time()
    recorded = 0
    with out.open("w") as fh:
        fh.write(json.dumps(header) + "\n")
        for i, (config, reason) in enumerate(zip(configs, reasons, strict=True)):
            if time_limit_s is not None and time.time() - start > time_limit_s:
                print(f"  time limit: {i} of {len(configs)} configs recorded in {time.time() - start:.0f} s")
                break
            recorded += 1
            if reason is None:
                prepared[i].result()
            record = _record(workload, config, reason, i, device)
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            counts[record["status"]] = counts.get(record["status"], 0) + 1
            if (i + 1) % 25 == 0 or i + 1 == len(configs):
                print(f"  {i + 1}/{len(configs)} configs, {time.time() - start:.0f} s, {counts}", flush=True)
    if procs is not None:
        procs.shutdown(wait=False, cancel_futures=True)
    pool.shutdown(wait=True, cancel_futures=True)
    if recorded < len(configs):  # say in the header what the file holds
        lines = out.read_text().splitlines()
        lines[0] = json.dumps({**header, "configs_recorded": recorded, "truncated": f"time limit {time_limit_s} s"})
        out.write_text("\n".join(lines) + "\n")
    return counts


def _compile_in_process(workload_name: str, args: dict[str, Any], config: dict[str, Any]) -> None:
    """Compile one config in a worker process (its kernels land in Triton's on-disk cache)."""
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.registry import workload_class

    global _WORKER_WORKLOAD
    if _WORKER_WORKLOAD is None:
        _WORKER_WORKLOAD = workload_class(workload_name)(**args)
    _WORKER_WORKLOAD.prepare(config, device_info())


_WORKER_WORKLOAD: Any = None


def _ahead_compiles(
    workload_name: str, args: dict[str, Any], configs: list[dict[str, Any]], procs: int
) -> tuple[concurrent.futures.Executor | None, dict[int, concurrent.futures.Future]]:
    """Submit every config to ``procs`` spawned compile processes (none when ``procs`` is 0)."""
    if procs <= 0:
        return None, {}
    import multiprocessing

    executor = concurrent.futures.ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"))
    futures = {n: executor.submit(_compile_in_process, workload_name, args, c) for n, c in enumerate(configs)}
    return executor, futures


def _prepare_after(ahead: concurrent.futures.Future | None, workload: Any, config: dict, device: Any) -> None:
    """The workload's own prepare, once the process compile of the same config (if any) has ended."""
    if ahead is not None:
        try:
            ahead.result()
        except (Exception, concurrent.futures.CancelledError):  # the prepare below meets it again, keeps it
            pass
    workload.prepare(config, device)


def _command() -> str:
    command = " ".join(["python", *sys.argv])
    out_dir = os.environ.get("OUT")
    return command.replace(out_dir.rstrip("/") + "/", "") if out_dir else command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(GRIDS))
    parser.add_argument("--out", required=True, help="the .jsonl file to write")
    parser.add_argument("--args", help="JSON object overriding the family's workload args")
    parser.add_argument("--limit", type=int, help="record only the first N configs (a smoke run)")
    parser.add_argument("--compile-threads", type=int, default=8)
    parser.add_argument(
        "--compile-procs", type=int, default=0, help="processes that compile ahead (Triton's disk cache)"
    )
    parser.add_argument("--rep-ms", type=float, help="timed milliseconds per config (default: the workload's)")
    parser.add_argument("--warmup-ms", type=float, help="warm-up milliseconds per config (default: the workload's)")
    parser.add_argument("--max-time-ms", type=float, help="cap on timed milliseconds per config (default: 2000)")
    parser.add_argument("--order", choices=["grid", "random"], default="grid")
    parser.add_argument("--seed", type=int, default=0, help="the random order's seed")
    parser.add_argument("--time-limit-s", type=float, help="start no config after this many seconds")
    ns = parser.parse_args()
    from tuner.workloads import measure

    for key, value in (("rep_ms", ns.rep_ms), ("warmup_ms", ns.warmup_ms), ("max_time_ms", ns.max_time_ms)):
        if value is not None:
            measure.GPU_TIMING[key] = value
    family = GRIDS[ns.family]
    args = {**family["args"], **(json.loads(ns.args) if ns.args else {})}
    counts = record_landscape(
        family["workload"],
        args,
        family["grid"],
        Path(ns.out),
        compile_threads=ns.compile_threads,
        limit=ns.limit,
        when=family.get("when"),
        order_seed=ns.seed if ns.order == "random" else None,
        time_limit_s=ns.time_limit_s,
        compile_procs=ns.compile_procs,
    )
    print(json.dumps({"family": ns.family, "out": ns.out, "counts": counts}))


if __name__ == "__main__":
    main()
