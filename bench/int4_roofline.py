"""Weight-only int4/int8 GEMM against the HBM roofline and bf16 ``torch.matmul``, on this GPU.

For each weight shape (N, K) and batch M, every candidate tile of the packed kernel
(:mod:`kernels.quant.quant_gemm_packed`) and the best configs of the older kernel
(:mod:`kernels.quant.quant_gemm`, its space's seeds) are compiled ahead in a process pool, checked
against the fp32 product and timed; the fastest is then re-measured interleaved with bf16
``torch.matmul`` (the baseline) and the ratio of the medians is the verdict.

Timing: each candidate is captured in a CUDA graph of ``calls`` back-to-back products rotating
over copies of the weights that together exceed twice the L2 (so every call streams its weights
from HBM, as a decode step does), and a sample is one replay divided by the calls. The copy
bandwidth is a device-to-device ``copy_`` of a 2 GiB buffer (bytes read plus written, per second),
measured the same way in the same run; the bandwidth target is the bytes of packed weights plus
scales over the time, divided by it.

``--floor`` also measures, per weight set, the fastest pure read of the packed words
(:mod:`bench.stream_floor`), and each entry then says how many times that floor the GEMM takes.

    PYTHONPATH=. python bench/int4_roofline.py --floor --out bench/results/int4-roofline-h200.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import os
import statistics
import time
from typing import Any

from bench.common import median, ratio_span, verdict, write_result

#: (N, K): the Llama-style MLP up (4096 -> 14336) and down (14336 -> 4096) projections and a square one.
SHAPES: list[tuple[int, int]] = [(14336, 4096), (4096, 14336), (8192, 8192)]
GROUP = 128
L2_BYTES = 60 * 2**20  # above the H200's 50 MiB


def packed_candidates(m: int, bits: int) -> list[dict[str, int]]:
    """Tiles of the packed kernel for M rows: the GEMV path at M = 1, tensor cores above."""
    out: list[dict[str, int]] = []
    base = {"UNROLL": 1}
    pipelines = ((1, 1, 0), (0, 2, 0), (0, 3, 0), (0, 4, 0))  # (PREFETCH, num_stages, TMA) of tensor-core tiles
    if m == 1:
        # PREFETCH keeps one span in flight in registers; num_stages > 1 pipelines the loop through shared memory.
        for bn, sk, w, (pf, st) in itertools.product(
            (32, 64, 128), (2, 4, 8, 16), (2, 4, 8), ((0, 1), (1, 1), (0, 2), (0, 3), (0, 4), (0, 6))
        ):
            out.append({**base, "BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "PREFETCH": pf,
                        "num_stages": st})  # fmt: skip
        plain = [{**c, "FAST_DECODE": 0} for c in out if c["BLOCK_N"] == 64 and c["num_warps"] == 4]
        out += plain + [{**c, "FAST_DECODE": 2} for c in out]  # fp32 pairs, biases off once per span
        if bits == 4:  # fp32 pairs with K cut finer (1-2 spans per program) and the K loop unrolled
            for bn, sk, w, unroll, (pf, st) in itertools.product(
                (32, 64, 128), (32, 64), (2, 4), (1, 2, 4), ((0, 1), (1, 1), (0, 3))
            ):
                out.append({"UNROLL": unroll, "BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w,
                            "PREFETCH": pf, "num_stages": st, "FAST_DECODE": 2})  # fmt: skip
            for bn, sk, w, unroll in itertools.product((32, 64, 128), (8, 16), (2, 4), (2, 4)):
                out.append({"UNROLL": unroll, "BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w,
                            "PREFETCH": 0, "num_stages": 1, "FAST_DECODE": 2})  # fmt: skip
        # the words by bulk tensor copies (TMA), num_stages - 1 spans in flight per program
        for bn, sk, w, st in itertools.product((32, 64, 128, 256), (2, 4, 8, 16), (2, 4), (3, 4, 6)):
            tma = {**base, "BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "PREFETCH": 0,
                   "num_stages": st, "TMA": 1}  # fmt: skip
            out.append({**tma, "FAST_DECODE": 2} if bits == 4 else {**tma, "num_warps": 2 * w})
        out += swapped(16, (64, 128, 256), (2, 4, 8, 16), (4, 8), (3, 4, 6))  # tensor cores, X padded to 16 rows
        # STREAM: programs per SM, each an equal run of (tile, span) steps in one pipelined loop
        for bn, w, st, t, sm in itertools.product((128, 256), (4,), (3, 6), (0, 1), (2, 3, 4)):
            gemv = {**base, "BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": 1, "num_warps": w, "PREFETCH": 0,
                    "num_stages": st, "TMA": t, "STREAM": sm}  # fmt: skip
            out.append({**gemv, "FAST_DECODE": 2} if bits == 4 else gemv)
        out += streamed(16, (128, 256), (4,), (3, 4, 6), (1, 2), (2, 3, 4))
        out += capped(16)
    elif m < 32:
        tma = ((0, 3, 1), (0, 4, 1), (0, 6, 1))  # the words by TMA, num_stages - 1 spans in flight
        for bn, sk, w, (pf, st, t) in itertools.product((64, 128, 256), (2, 4, 8, 16), (4, 8), pipelines + tma):
            out.append({**base, "BLOCK_M": 16, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "PREFETCH": pf,
                        "num_stages": st, **({"TMA": 1} if t else {})})  # fmt: skip
        out += swapped(16, (64, 128, 256), (2, 4, 8, 16), (4, 8), (3, 4, 6))
        out += streamed(16, (128, 256), (4, 8), (3, 4), (1, 2), (2, 3))
        out += capped(16)
    else:
        tma = ((0, 3, 1), (0, 4, 1))
        for bm, bn, sk, w, (pf, st, t) in itertools.product((32, 64), (64, 128), (1, 2, 4, 8), (4, 8), pipelines + tma):
            out.append({**base, "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "PREFETCH": pf,
                        "num_stages": st, **({"TMA": 1} if t else {})})  # fmt: skip
        for bm in (32, 64):
            out += swapped(bm, (64, 128, 256), (1, 2, 4, 8), (4, 8), (3, 4))
            out += streamed(bm, (128,), (4, 8), (3, 4), (2, 3), (2, 3))
        # two warpgroups sharing X's slices (the TMA 2 winners at K >= 8192), pipelined 2 or 5 deep
        out += [c for c in swapped(64, (128, 256), (2, 4, 8), (8,), (2, 5)) if c["TMA"] == 2 and c["SWAP"] >= 2]
    if bits == 8:
        out = [c for c in out if c["num_warps"] >= 4 and "FAST_DECODE" not in c]
    return out


def swapped(block_m: int, bns: tuple[int, ...], splits: tuple[int, ...], warps: tuple[int, ...],
            stages: tuple[int, ...]) -> list[dict[str, int]]:  # fmt: skip
    """Tensor-core tiles computing Y's tile transposed (``SWAP``: the decoded weights as the A operand, held in
    registers; X through shared memory), the words by TMA; ``SWAP`` 1 multiplies 16-row slices, 2 whole spans,
    3 whole spans with the scales folded into the weights (the product accumulated across spans). Whole-span
    tiles come twice: X loaded by the threads (``TMA`` 1) and X's span slices by tensor copies (``TMA`` 2)."""
    return [
        {"UNROLL": 1, "BLOCK_M": block_m, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "PREFETCH": 0,
         "num_stages": st, "TMA": tma, "SWAP": swap}
        for bn, sk, w, st, swap, tma in itertools.product(bns, splits, warps, stages, (1, 2, 3), (1, 2))
        if not (w == 8 and bn < 128)  # a warpgroup's wgmma takes 64 rows of the weights' tile
        and (tma == 1 or swap >= 2)
    ]  # fmt: skip


def capped(block_m: int) -> list[dict[str, int]]:
    """The swapped 16-row slices of 256-column tiles (242 registers a thread: two 4-warp programs per SM) capped
    at 168 registers (``MAXNREG``, 16 bytes spilled on sm_90) so that three fit, streamed three per SM or split."""
    tiles = streamed(block_m, (256,), (4,), (3, 4), (1,), (3,)) + swapped(block_m, (256,), (2, 4, 8), (4,), (3, 4))
    return [{**c, "MAXNREG": 168} for c in tiles if c["SWAP"] == 1]


def streamed(block_m: int, bns: tuple[int, ...], warps: tuple[int, ...], stages: tuple[int, ...],
             swaps: tuple[int, ...], programs: tuple[int, ...]) -> list[dict[str, int]]:  # fmt: skip
    """Swapped tensor-core tiles on the ``STREAM`` grid (``programs`` per SM, each an equal share of every
    tile's spans, the loads pipelined across tiles), the words by TMA."""
    return [
        {**c, "SPLIT_K": 1, "STREAM": sm}
        for c in swapped(block_m, bns, (1,), warps, stages)
        for sm in programs
        if c["SWAP"] in swaps
    ]


def old_candidates(m: int, bits: int) -> list[dict[str, int]]:
    """The older kernel's space seeds that fit this M and bit width (its tuned and hand-picked tiles)."""
    from tuner.study.space import compile_space, load_space_file

    space = compile_space(load_space_file("quant_gemm.yaml"))
    picks = []
    for seed in space.seeds:
        if seed.get("kernel", "tiled") != "tiled":
            continue
        if seed["bits"] != bits or seed["group_size"] != GROUP or seed["precision"] != "bf16":
            continue
        if (m == 1) != (seed["BLOCK_M"] == 1) or seed["BLOCK_M"] > max(16, m):
            continue
        picks.append({p: seed[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")}
                     | {"SWAP_AB": seed.get("SWAP_AB", 0)})  # fmt: skip
    return picks


def _compile(job: dict[str, Any]) -> tuple[str, str | None]:
    """Compile one candidate in a worker process (fills Triton's disk cache); the error text when it fails."""
    try:
        if job["family"] == "packed":
            from kernels.quant.quant_gemm_packed import compile_only
        else:
            from kernels.quant.quant_gemm import compile_only
        compile_only(*job["shape"], precision="bf16", bits=job["bits"], group_size=GROUP, **job["config"])
        return job["key"], None
    except Exception as exc:  # reported per candidate
        return job["key"], f"{type(exc).__name__}: {exc}"[:300]


def graph_time_us(fn: Any, calls: int, replays: int = 15) -> float:
    """Median microseconds per call of ``calls`` back-to-back calls captured in one CUDA graph."""
    import torch

    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth: bytes read plus written per second, in GB/s."""
    import torch

    src = torch.empty(2**31 // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    warm = time.time()
    while time.time() - warm < 0.5:  # clocks up from idle before the first sample
        dst.copy_(src)
    torch.cuda.synchronize()
    us = min(graph_time_us(lambda: dst.copy_(src), calls=5) for _ in range(3))
    return 2 * src.numel() * 4 / (us * 1e-6) / 1e9


class Bench:
    """Operands of one (N, K): fp32 master weights, their packed / old-layout / bf16 copies, rotated."""

    def __init__(self, n: int, k: int, bits: int) -> None:
        import torch

        from kernels.quant.quant_gemm import quantize_weights
        from kernels.quant.quant_gemm_packed import repack

        self.n, self.k, self.bits = n, k, bits
        gen = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(k, n, device="cuda", generator=gen) * 0.02
        old = quantize_weights(w, bits, GROUP, torch.bfloat16)
        packed = repack(old.qweight, old.scales, bits, GROUP)
        copies = max(2, -(-2 * L2_BYTES // packed.nbytes))
        self.packed = [packed] + [packed.clone() for _ in range(copies - 1)]
        self.old = [old] + [old.clone() for _ in range(copies - 1)]
        self.reference_w = packed.dequantize()
        dense = w.to(torch.bfloat16)
        self.dense = [dense] + [dense.clone() for _ in range(max(1, -(-2 * L2_BYTES // (k * n * 2)) - 1))]
        self.weight_bytes = packed.nbytes
        del w

    def x(self, m: int) -> Any:
        import torch

        gen = torch.Generator(device="cuda").manual_seed(m)
        return torch.randn(m, self.k, device="cuda", generator=gen).to(torch.bfloat16)

    def rotating(self, copies: list[Any], call: Any) -> tuple[Any, int]:
        state = {"i": 0}

        def fn() -> Any:
            state["i"] = (state["i"] + 1) % len(copies)
            return call(copies[state["i"]])

        return fn, len(copies) * max(2, 24 // len(copies))

    def packed_fn(self, x: Any, config: dict[str, int]) -> tuple[Any, int]:
        import torch

        from kernels.quant.quant_gemm_packed import packed_matmul

        out = torch.empty(x.shape[0], self.n, device="cuda", dtype=x.dtype)
        return self.rotating(self.packed, lambda w: packed_matmul(x, w, out=out, **config))

    def old_fn(self, x: Any, config: dict[str, int]) -> tuple[Any, int]:
        import torch

        from kernels.quant.quant_gemm import quant_matmul

        out = torch.empty(x.shape[0], self.n, device="cuda", dtype=x.dtype)
        ws = torch.empty(x.shape[0], self.n, device="cuda", dtype=torch.float32)
        return self.rotating(
            self.old,
            lambda w: quant_matmul(
                x, w.qweight, w.scales, bits=self.bits, group_size=GROUP, out=out, workspace=ws, **config
            ),
        )

    def dense_fn(self, x: Any) -> tuple[Any, int]:
        import torch

        out = torch.empty(x.shape[0], self.n, device="cuda", dtype=x.dtype)
        return self.rotating(self.dense, lambda w: torch.matmul(x, w, out=out))

    def error(self, x: Any, y: Any) -> float:
        ref = x.float() @ self.reference_w
        return float((y.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def sweep(bench: Bench, m: int, failed: dict[str, str], families: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every candidate of (N, K, M) that compiled, checked and timed; fastest first."""
    x = bench.x(m)
    rows = []
    for family in families:
        configs = packed_candidates(m, bench.bits) if family == "packed" else old_candidates(m, bench.bits)
        for config in configs:
            key = _key(family, bench.bits, m, bench.k, config)
            if key in failed:
                continue
            try:
                fn, calls = (bench.packed_fn if family == "packed" else bench.old_fn)(x, config)
                err = bench.error(x, fn())
                if not err < 2e-2:
                    rows.append({"family": family, "config": config, "error": err, "status": "wrong"})
                    continue
                us = graph_time_us(fn, calls)
            except Exception as exc:  # reported per candidate
                rows.append({"family": family, "config": config, "status": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            rows.append({"family": family, "config": config, "us": us, "error": err, "status": "ok",
                         "tb_s": bench.weight_bytes / (us * 1e-6) / 1e12})  # fmt: skip
    return sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["us"]) + [
        r for r in rows if r["status"] != "ok"
    ]


def _key(family: str, bits: int, m: int, k: int, config: dict[str, int]) -> str:
    # One binary per config and K (Triton specializes ints on divisibility by 16 and on 1; the packed kernel takes
    # K as a constant): M == 1 compiles its own, the other Ms share one.
    return f"{family}|{bits}|{'m1' if m == 1 else 'm'}|{k if family == 'packed' else ''}|{sorted(config.items())}"


def precompile(plan: list[tuple[int, int, int, int]], workers: int) -> dict[str, str]:
    """Compile every candidate of the plan (bits, n, k, m) in worker processes; failures by key."""
    jobs, seen = [], set()
    for bits, n, k, m in plan:
        for family, configs in (("packed", packed_candidates(m, bits)), ("old", old_candidates(m, bits))):
            for config in configs:
                key = _key(family, bits, m, k, config)
                if key not in seen:
                    seen.add(key)
                    jobs.append({"family": family, "key": key, "shape": (m, n, k), "bits": bits, "config": config})
    failed: dict[str, str] = {}
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for key, error in pool.map(_compile, jobs, chunksize=4):
            if error:
                failed[key] = error
    print(f"compiled {len(jobs) - len(failed)} of {len(jobs)} candidates", flush=True)
    return failed


def read_floor(bench: Bench) -> dict[str, Any]:
    """The fastest pure read of the packed words (:mod:`bench.stream_floor`), rotating over the same copies."""
    import torch

    from bench.stream_floor import candidates, reader

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    words = [w.qweight for w in bench.packed]
    word_bytes = words[0].numel() * 4
    rows = []
    for config in candidates(sms):
        try:
            us = graph_time_us(*bench.rotating([reader(w, config) for w in words], lambda read: read()))
        except Exception as exc:  # a box the TMA cannot take, a compile error: reported, not fatal
            rows.append({"config": config, "status": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        rows.append({"config": config, "us": us, "tb_s": word_bytes / (us * 1e-6) / 1e12, "status": "ok"})
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["us"])
    best_of = {kind: next((r for r in ok if r["config"]["kind"] == kind), None) for kind in ("flat", "tma")}
    return {"word_bytes": word_bytes, "best": ok[0] if ok else None, "best_of_kind": best_of,
            "failures": [r for r in rows if r["status"] != "ok"][:8]}  # fmt: skip


def interleaved_samples_us(fns: dict[str, tuple[Any, int]], rounds: int) -> dict[str, list[float]]:
    """Each product's time in us, ``rounds`` rounds interleaved (A B C A B C ...), every round's value by name."""
    values: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, calls) in fns.items():
            values[name].append(graph_time_us(fn, calls))
    return values


def medians_of(samples: dict[str, list[float]]) -> dict[str, float]:
    """Each name's median."""
    return {name: median(v) for name, v in samples.items()}  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 2))
    parser.add_argument("--ms", default="1,16,64")
    parser.add_argument("--quick", action="store_true", help="one shape, fewer candidates (smoke run)")
    parser.add_argument("--floor", action="store_true", help="also measure the pure-read floor of every weight set")
    parser.add_argument("--shapes", default=None, help="(N, K) pairs as N:K,N:K (default: the three of SHAPES)")
    parser.add_argument("--bits", default="4,8", help="weight widths to sweep (int8 at M = 1 only)")
    args = parser.parse_args()
    import torch

    started = time.time()
    ms = [int(v) for v in args.ms.split(",")]
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.shapes:
        shapes = [(int(n), int(k)) for n, k in (pair.split(":") for pair in args.shapes.split(","))]
    widths = [int(v) for v in args.bits.split(",")]
    plan = [(bits, n, k, m) for bits in widths for n, k in shapes for m in (ms if bits == 4 else [1])]
    failed = precompile(plan, args.workers)
    bandwidth = copy_bandwidth_gbs()
    print(f"copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    shapes_out: list[dict[str, Any]] = []
    for bits in widths:
        for n, k in shapes:
            bench = Bench(n, k, bits)
            floor = read_floor(bench) if args.floor else None
            for m in ms if bits == 4 else [1]:
                rows = sweep(bench, m, failed, ("packed", "old"))
                ok = [r for r in rows if r["status"] == "ok"]
                best = next((r for r in ok if r["family"] == "packed"), None)
                best_old = next((r for r in ok if r["family"] == "old"), None)
                x = bench.x(m)
                fns = {"bf16_matmul": bench.dense_fn(x)}
                if best:
                    fns["packed"] = bench.packed_fn(x, best["config"])
                if best_old:
                    fns["old"] = bench.old_fn(x, best_old["config"])
                samples = interleaved_samples_us(fns, args.rounds)
                final = medians_of(samples)
                entry = {
                    "bits": bits, "n": n, "k": k, "m": m, "weight_bytes": bench.weight_bytes,
                    "interleaved_us": final, "interleaved_samples_us": samples, "best_packed": best,
                    "best_old": best_old,
                    "speedup_vs_bf16": final["bf16_matmul"] / final["packed"] if best else None,
                    "bandwidth_fraction": bench.weight_bytes / (final["packed"] * 1e-6) / (bandwidth * 1e9)
                    if best else None,
                    "top": ok[:12], "failures": [r for r in rows if r["status"] != "ok"][:20],
                }  # fmt: skip
                if floor is not None and floor["best"] and best:
                    entry["read_floor"] = floor
                    entry["packed_over_read_floor"] = final["packed"] / floor["best"]["us"]
                shapes_out.append(entry)
                print(f"int{bits} M={m} N={n} K={k}: {final}  x{entry['speedup_vs_bf16']}", flush=True)
                save(shapes_out, bandwidth, failed, started, args.out)
            del bench
            torch.cuda.empty_cache()
    bandwidth_end = copy_bandwidth_gbs()
    print(f"copy bandwidth at the end {bandwidth_end:.0f} GB/s", flush=True)
    save(shapes_out, bandwidth, failed, started, args.out, bandwidth_end)


def save(shapes_out: list[dict[str, Any]], bandwidth: float, failed: dict[str, str], started: float,
         out: str | None, bandwidth_end: float | None = None) -> None:  # fmt: skip
    """Write what is measured so far (called after every shape, so a run cut short keeps its results)."""
    targets = make_targets(shapes_out)
    write_result(
        {
            "what": "weight-only int4/int8 GEMM (group 128, bf16 activations) vs bf16 torch.matmul and copy bandwidth",
            "copy_bandwidth_gbs": bandwidth,
            "copy_bandwidth_end_gbs": bandwidth_end,
            "compile_failures": len(failed),
            "compile_failure_examples": list(failed.items())[:10],
            "wall_s": time.time() - started,
            "shapes": shapes_out,
            "targets": targets,
            "summary": [{k: t[k] for k in ("target", "ratio", "verdict")} for t in targets],
        },
        out,
    )


def make_targets(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets from the measured entries (ratio: higher is better)."""
    by = {(e["bits"], e["n"], e["k"], e["m"]): e for e in entries}
    targets = []

    def add(target: str, tuned: float | None, baseline: float | None, ratio: float | None, goal: float,
            span: list[float] | None = None) -> None:  # fmt: skip
        targets.append({"target": target, "tuned": tuned, "baseline": baseline, "ratio": ratio, "goal": goal,
                        "verdict": verdict(ratio, goal), "ratio_range": span})  # fmt: skip

    def samples(e: dict[str, Any], name: str) -> list[float]:
        return e.get("interleaved_samples_us", {}).get(name, [])

    for (bits, n, k, m), e in sorted(by.items()):
        us = e["interleaved_us"]
        shape = f"N={n} K={k}"
        # speed-ups over bf16 per interleaved round (bf16's time over ours, each round's pair)
        speedup_span = ratio_span(samples(e, "bf16_matmul"), samples(e, "packed"))
        if bits == 4 and m == 1:
            fraction, packed = e["bandwidth_fraction"], us.get("packed")
            times = samples(e, "packed")  # the fraction is inverse to the time: the same bytes and bandwidth
            fraction_span = None if len(times) < 2 else [fraction * packed / max(times), fraction * packed / min(times)]
            add(f"int4 M=1 {shape}: weight+scale bytes at >= 60% of copy bandwidth (tuned us, fraction)",
                packed, None, fraction, 0.60, fraction_span)  # fmt: skip
            add(f"int4 M=1 {shape}: >= 3x bf16 torch.matmul (us)", us.get("packed"), us["bf16_matmul"],
                e["speedup_vs_bf16"], 3.0, speedup_span)  # fmt: skip
        if bits == 4 and m == 16 and (4, n, k, 1) in by:
            one = by[(4, n, k, 1)]["interleaved_us"].get("packed")
            sixteen = us.get("packed")
            ratio = one / sixteen * 1.25 if one and sixteen else None  # >= 1 <=> M=16 time <= 1.25 x M=1 time
            span = ratio_span(samples(by[(4, n, k, 1)], "packed"), samples(e, "packed"), paired=False)  # apart
            add(f"int4 M=16 {shape}: within 1.25x of the M=1 time (M=16 us vs M=1 us; ratio 1.25*t1/t16)",
                sixteen, one, ratio, 1.0, [1.25 * r for r in span] if span else None)  # fmt: skip
        if bits == 4 and m == 64:
            add(f"int4 M=64 {shape}: >= 1.3x bf16 torch.matmul (us)", us.get("packed"), us["bf16_matmul"],
                e["speedup_vs_bf16"], 1.3, speedup_span)  # fmt: skip
        if bits == 8 and m == 1:
            add(f"int8 M=1 {shape}: >= 1.8x bf16 torch.matmul (us)", us.get("packed"), us["bf16_matmul"],
                e["speedup_vs_bf16"], 1.8, speedup_span)  # fmt: skip
    return targets


if __name__ == "__main__":
    main()
