"""The kernel-variant targets on this GPU: the tuned GEMM and attention kernels against cuBLAS / cuDNN, side by side.

For each target shape the candidates (the fastest configs of the new variants' landscapes in
``--landscapes``, plus the best configs of the older kernels) are compiled ahead on a thread
pool, checked for numerics and timed through the workload (``Workload.run``: CUDA events, L2
flushed, adaptive repetitions). A GEMM's winner is chosen as a tuner would choose it, not by one
noisy sample: the sweep's ``--finalists`` fastest (and the fastest one's twin with the stream-K
tail flipped) are re-measured interleaved, ``--select-rounds`` times, and the highest median
wins. The winner is then measured afresh, interleaved with the library call (tuned, library,
tuned, library, ... ``--rounds`` times, the same stopwatch), so the selection's samples never
enter the verdict; the ratio of the medians is the verdict.

Baselines: ``torch.matmul`` (cuBLAS) for bf16 / fp16; ``torch._scaled_mm`` (cuBLASLt, per-tensor
scales, bf16 output) for fp8, with fast accumulation when the tuned config uses it (the
strongest fair library call); for attention the fastest of SDPA's cuDNN and flash backends,
each measured in the same rounds.

    PYTHONPATH=. python bench/kernel_variants.py --landscapes bench/landscapes \
        --out bench/results/kernel-variants-h200.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import time
from pathlib import Path
from typing import Any

from bench.common import interleaved, median, ratio_span, tflops_measurer, verdict, write_result
from bench.gemm_targets import baseline_fn

#: name -> (m, n, k): 8192^3 and two Llama-style projections with 8192 tokens (4096 -> 14336, 4096 -> 4096).
GEMM_SHAPES: dict[str, tuple[int, int, int]] = {
    "8192^3": (8192, 8192, 8192),
    "8192x14336x4096": (8192, 14336, 4096),
    "8192x4096x4096": (8192, 4096, 4096),
}
GEMM_TARGETS: list[tuple[str, str]] = [(s, p) for p in ("bf16", "fp16") for s in GEMM_SHAPES] + [("8192^3", "fp8")]
#: fp8 candidates (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, EPILOGUE_SUBTILE) for the persistent kernels.
FP8_TILES: list[tuple[int, int, int, int, int, bool]] = [
    (128, 256, 128, 8, 3, True),
    (128, 256, 128, 8, 4, True),
    (256, 128, 128, 8, 3, False),
    (128, 256, 64, 8, 4, False),
    (128, 128, 128, 4, 4, False),
    (256, 128, 128, 8, 4, True),
]
#: Attention shapes: D=128 (H=16) and D=64 (H=32), S from 1024 to 8192 with B*S = 16384, causal and full.
ATTENTION_SHAPES: list[dict[str, Any]] = [
    {"batch": 16384 // s, "heads": 2048 // d, "seq_len": s, "head_dim": d, "causal": c}
    for d in (128, 64)
    for s in (1024, 2048, 4096, 8192)
    for c in (True, False)
]


def gemm_shape(name: str) -> tuple[int, int, int]:
    """(m, n, k) of a GEMM_SHAPES name or of ``MxNxK`` (``8192x4096x14336``: a down projection, 8192 tokens)."""
    if name in GEMM_SHAPES:
        return GEMM_SHAPES[name]
    parts = name.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"GEMM shape {name!r}: expected one of {sorted(GEMM_SHAPES)} or MxNxK, e.g. 8192x4096x14336")
    m, n, k = (int(p) for p in parts)
    return m, n, k


def _landscape_best(path: Path, top: int, **match: Any) -> list[dict[str, Any]]:
    """The ``top`` fastest OK configs of a landscape file whose params match ``match``."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]
    ok = [r for r in rows if r["status"] == "ok" and all(r["params"].get(k) == v for k, v in match.items())]
    ok.sort(key=lambda r: -(r["metrics"].get("tflops") or 0))
    return [r["params"] for r in ok[:top]]


def gemm_candidates(precision: str, landscapes: Path, top: int) -> list[dict[str, Any]]:
    """Configs to try at a GEMM target: the landscape's fastest persistent ones and the tutorial seeds."""
    tutorial = [
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    ]
    if precision == "fp8":
        tutorial = [{"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}]
        persistent = [
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s,
             "kernel": kernel, "EPILOGUE_SUBTILE": sub, "FP8_FAST_ACCUM": True}
            for bm, bn, bk, w, s, sub in FP8_TILES for kernel in ("persistent_tma", "persistent_tma_ws")
        ]  # fmt: skip
    else:
        persistent = _landscape_best(landscapes / "gemm_tma-8192-bf16.jsonl", top)
        persistent += refinements(persistent[:3])
    # The stream-K tail (split the last partial wave by K) on the strongest tiles.
    persistent += [{**c, "STREAM_K": True} for c in persistent[:4] + persistent[-4:]]
    configs = [{**c, "kernel": "tutorial"} for c in tutorial] + persistent
    return [{**c, "precision": precision, "pad_k": False} for c in configs]


def refinements(best: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neighbours of the landscape's best that its grid left out: other GROUP_M, and 256-row tiles (two
    consumer warpgroups of 128 rows, the shape cuBLAS picks on Hopper), which the recording did not reach."""
    out = [{**c, "GROUP_M": g} for c in best for g in (4, 16)]
    for kernel in ("persistent_tma", "persistent_tma_ws"):
        for stages in (3, 4):
            out.append({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
                        "num_stages": stages, "kernel": kernel, "EPILOGUE_SUBTILE": True})  # fmt: skip
    return out


def attention_candidates(landscapes: Path, top: int) -> list[dict[str, Any]]:
    """Configs to try at an attention target: the persistent landscape's fastest bf16 ones and the tutorial's."""
    tutorial = [
        {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "use_tma": False},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "use_tma": True},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "use_tma": True},
    ]
    persistent = _landscape_best(landscapes / "attention_persistent-s4096-d128-causal.jsonl", top, precision="bf16")
    return [{**c, "kernel": "tutorial", "precision": "bf16"} for c in tutorial] + persistent


def _sweep(workload: Any, device: Any, configs: list[dict[str, Any]], threads: int) -> list[tuple[float, dict]]:
    """Compile ahead in threads, then run each feasible config once; (TFLOP/s, config) of the OK ones, fastest first."""
    from tuner.workloads.base import TrialContext

    feasible = [c for c in configs if workload.static_check(c, device) is None]
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda c: workload.prepare(c, device), feasible))
    results = []
    for config in feasible:
        try:
            result = workload.run(config, device, TrialContext())
        except Exception as exc:  # a candidate that breaks is skipped, as a study would record it
            print(f"    {config}: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        if result.ok:
            results.append((result.metrics["tflops"], config))
        else:
            print(f"    {result.status.value}: {config} {(result.error or '')[:200]}", flush=True)
    results.sort(key=lambda r: -r[0])
    return results


def _sdpa_baselines(shape: dict[str, Any]) -> dict[str, Any]:
    """TFLOP/s measurers of SDPA's cuDNN and flash backends on the shape (bf16)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.attention import attention_flops

    b, h, s, d, causal = (shape[k] for k in ("batch", "heads", "seq_len", "head_dim", "causal"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    flops = attention_flops(b, h, s, d, causal)
    out: dict[str, Any] = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):

        def call(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        try:
            call()
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"    SDPA {name} unavailable: {exc}"[:200], flush=True)
            continue
        out[name] = tflops_measurer(call, flops)
    return out


def _tuned(workload: Any, device: Any, config: dict[str, Any]) -> Any:
    from tuner.workloads.base import TrialContext

    def measure() -> float:
        result = workload.run(config, device, TrialContext())
        return result.metrics["tflops"] if result.ok else math.nan

    return measure


def select_finalist(measurers: dict[str, Any], rounds: int) -> tuple[str, dict[str, list[float]]]:
    """Re-measure the finalists (name -> TFLOP/s measurer) interleaved, ``rounds`` times; the name with the highest
    median, and every sample by name. A finalist that never gave a finite value cannot win; with one finalist
    nothing is measured."""
    if len(measurers) == 1:
        return next(iter(measurers)), {}
    samples = interleaved(measurers, rounds)
    medians = {name: median(values) for name, values in samples.items()}
    finite = [name for name in measurers if medians[name] is not None]
    if not finite:
        raise RuntimeError(f"no finalist gave a finite time in {rounds} rounds: {sorted(measurers)}")
    return max(finite, key=lambda name: medians[name]), samples  # type: ignore[arg-type, return-value]


def _finalists(swept: list[tuple[float, dict]], count: int, stream_k_twin: bool) -> list[dict[str, Any]]:
    """The sweep's ``count`` fastest configs and, with ``stream_k_twin`` (the GEMM workload, whose persistent kernels
    have a ``STREAM_K`` knob), the fastest one's twin with the stream-K tail flipped (a knob whose effect is within
    the sweep's noise at most shapes)."""

    def tail(config: dict[str, Any]) -> dict[str, Any]:  # STREAM_K absent means off
        return {**config, "STREAM_K": bool(config.get("STREAM_K", False))}

    chosen = [config for _, config in swept[:count]]
    if stream_k_twin and chosen[0].get("kernel", "tutorial") != "tutorial":
        twin = {**chosen[0], "STREAM_K": not chosen[0].get("STREAM_K", False)}
        if tail(twin) not in [tail(c) for c in chosen]:
            chosen.append(twin)
    return chosen


def _selected(workload: Any, device: Any, swept: list[tuple[float, dict]], count: int, rounds: int,
              stream_k_twin: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """The winner among the sweep's finalists (:func:`_finalists`) by medians of interleaved re-measurement, and the
    record of it."""
    finalists = _finalists(swept, count, stream_k_twin)
    name, samples = select_finalist({str(i): _tuned(workload, device, c) for i, c in enumerate(finalists)}, rounds)
    record = []
    for i, config in enumerate(finalists):
        middle = median(samples.get(str(i), []))
        record.append({"config": config, "median_tflops": None if middle is None else round(middle, 1),
                       "samples": samples.get(str(i), [])})  # fmt: skip
    return finalists[int(name)], record


def _target_row(name: str, values: dict[str, list[float]], baseline_name: str | None, goal: float) -> dict[str, Any]:
    """A target from interleaved rounds (``values``: TFLOP/s by name): ``tuned``'s median over ``baseline_name``'s,
    with the per-round ratio's span (``ratio_range``)."""
    tuned = median(values["tuned"])
    baseline = median(values[baseline_name]) if baseline_name else None
    ratio = tuned / baseline if tuned and baseline else None
    span = ratio_span(values["tuned"], values[baseline_name]) if baseline_name else None
    return {
        "target": name,
        "tuned": None if tuned is None else round(tuned, 1),
        "baseline": None if baseline is None else round(baseline, 1),
        "ratio": None if ratio is None else round(ratio, 4),
        "goal": goal,
        "verdict": verdict(ratio, goal),
        "ratio_range": [round(r, 4) for r in span] if span else None,
    }


def run_gemm(shape: str, precision: str, landscapes: Path, top: int, rounds: int, threads: int,
             finalists: int = 4, select_rounds: int = 5) -> dict[str, Any]:  # fmt: skip
    from objectives.triton_gemm import TritonGemm
    from tuner.workloads.fingerprint import device_info

    m, n, k = gemm_shape(shape)
    workload, device = TritonGemm(m=m, n=n, k=k), device_info()
    started = time.time()
    swept = _sweep(workload, device, gemm_candidates(precision, landscapes, top), threads)
    if not swept:
        return {"shape": shape, "precision": precision, "error": "no candidate ran", "target": None}
    best, selection = _selected(workload, device, swept, finalists, select_rounds, stream_k_twin=True)
    fast = bool(best.get("FP8_FAST_ACCUM", True))
    baseline_name = "torch._scaled_mm" + (" (use_fast_accum)" if fast else "") if precision == "fp8" else "torch.matmul"
    measurers = {"tuned": _tuned(workload, device, best), "baseline": baseline_fn(m, n, k, precision, fast)}
    values = interleaved(measurers, rounds)
    row = _target_row(f"GEMM {precision} {shape} vs {baseline_name}", values, "baseline", 1.0)
    print(f"  {row}", flush=True)
    return {
        "shape": {"m": m, "n": n, "k": k},
        "precision": precision,
        "baseline": baseline_name,
        "sweep": [{"tflops": round(t, 1), "config": c} for t, c in swept],
        "selection": selection,
        "winner": best,
        "interleaved_tflops": values,
        "seconds": round(time.time() - started, 1),
        "target": row,
    }


def run_attention(shape: dict[str, Any], landscapes: Path, top: int, rounds: int, threads: int,
                  finalists: int = 4, select_rounds: int = 5) -> dict[str, Any]:  # fmt: skip
    from objectives.flash_attention import FlashAttention
    from tuner.workloads.fingerprint import device_info

    workload, device = FlashAttention(**shape), device_info()
    started = time.time()
    swept = _sweep(workload, device, attention_candidates(landscapes, top), threads)
    label = f"S={shape['seq_len']} D={shape['head_dim']} {'causal' if shape['causal'] else 'full'}"
    if not swept:
        return {"shape": shape, "error": "no candidate ran", "target": None}
    best, selection = _selected(workload, device, swept, finalists, select_rounds)
    measurers = {"tuned": _tuned(workload, device, best), **_sdpa_baselines(shape)}
    values = interleaved(measurers, rounds)
    libraries = {name: median(v) for name, v in values.items() if name != "tuned"}
    fastest = max(libraries, key=lambda name: libraries[name] or 0) if libraries else None
    goal = 1.0 if shape["head_dim"] == 64 else 0.95
    row = _target_row(f"attention fwd bf16 {label} vs SDPA {fastest}", values, fastest, goal)
    print(f"  {row}", flush=True)
    return {
        "shape": shape,
        "sweep": [{"tflops": round(t, 1), "config": c} for t, c in swept],
        "selection": selection,
        "winner": best,
        "interleaved_tflops": values,
        "fastest_library": fastest,
        "seconds": round(time.time() - started, 1),
        "target": row,
    }


def chosen_gemm_targets(shapes: list[str] | None, precisions: list[str] | None) -> list[tuple[str, str]]:
    """The (shape, precision) GEMM targets of a run: the standing ones, or ``shapes`` in each of ``precisions``."""
    if not shapes:
        if precisions:
            raise ValueError("--precisions applies only with --gemm-shapes (the standing targets have their own)")
        return GEMM_TARGETS
    from objectives.triton_gemm import TMA_PRECISIONS

    for shape in shapes:
        gemm_shape(shape)
    precisions = precisions or ["bf16", "fp16"]
    unknown = [p for p in precisions if p not in TMA_PRECISIONS]
    if unknown:
        raise ValueError(f"--precisions: {unknown} is not among {', '.join(TMA_PRECISIONS)}")
    return [(s, p) for p in precisions for s in shapes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", type=Path, default=Path("bench/landscapes"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=["gemm", "attention"], help="run one family of targets")
    parser.add_argument("--top", type=int, default=8, help="landscape configs tried per target")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the winner and the library")
    parser.add_argument("--finalists", type=int, default=4, help="the sweep's fastest configs re-measured to pick")
    parser.add_argument("--select-rounds", type=int, default=5, help="interleaved rounds of the finalists")
    parser.add_argument("--threads", type=int, default=12, help="compile-ahead threads")
    parser.add_argument("--head-dims", type=int, nargs="*", default=[128, 64], help="attention head dims to run")
    parser.add_argument("--attention-top", type=int, default=6, help="landscape configs tried per attention target")
    parser.add_argument("--gemm-shapes", nargs="*", help="GEMM shapes (MxNxK) instead of the standing targets")
    parser.add_argument("--precisions", nargs="*", help="with --gemm-shapes (default: bf16 fp16)")
    ns = parser.parse_args()
    try:  # a malformed shape or precision stops here, before any GPU work
        gemm_targets = chosen_gemm_targets(ns.gemm_shapes, ns.precisions)
    except ValueError as err:
        parser.error(str(err))
    result: dict[str, Any] = {"gemm": [], "attention": [], "targets": []}

    def save() -> None:
        result["targets"] = [r["target"] for r in result["gemm"] + result["attention"] if r.get("target")]
        result["summary"] = {t["target"]: (t["ratio"], t["verdict"]) for t in result["targets"]}
        write_result(result, ns.out)

    if ns.only in (None, "gemm"):
        for shape, precision in gemm_targets:
            print(f"GEMM {precision} {shape}", flush=True)
            result["gemm"].append(
                run_gemm(shape, precision, ns.landscapes, ns.top, ns.rounds, ns.threads, ns.finalists, ns.select_rounds)
            )
            save()
    if ns.only in (None, "attention"):
        for shape in [s for s in ATTENTION_SHAPES if s["head_dim"] in ns.head_dims]:
            print(f"attention {shape}", flush=True)
            result["attention"].append(
                run_attention(
                    shape, ns.landscapes, ns.attention_top, ns.rounds, ns.threads, ns.finalists, ns.select_rounds
                )
            )
            save()
    save()


if __name__ == "__main__":
    main()
