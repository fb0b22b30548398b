"""The warp-specialized Gluon int4/int8 GEMM (:mod:`kernels.quant.quant_gemm_ws`) against bf16 ``torch.matmul`` and
the packed Triton kernel's standing winners, side by side on this GPU.

Per weight shape (N, K) and batch M (int4 at M = 1, 16, 64; int8 at M = 1), every config of the Gluon kernel
(``BLOCK_N`` x ``NUM_STAGES`` x ``PROGRAMS_PER_SM`` x ``SCALE_ACC``, ``BLOCK_M`` the smallest tile holding M) is
compiled ahead in a process pool, checked against the fp32 product (max error over max value <= 2e-2) and timed as
:mod:`bench.int4_roofline` times (a CUDA graph of back-to-back products over weight copies beyond twice the
L2). The fastest is then re-measured interleaved with bf16 ``torch.matmul`` and with the packed kernel's winner
of ``--prior`` (a results file of ``bench/int4_roofline.py``), ``--rounds`` times, medians. The targets are
those of ``bench/int4_roofline.py``, taken by the faster of our two kernels (``packed`` in ``interleaved_us``
is that one; ``winner`` names it). ``--pdl`` also times the Gluon winner as programmatic dependent launches
(``ws_pdl``: in the graph each product's first words stream while the product before ends, as in a decode step
whose kernels all take part); reported beside the targets, not in them.

    PYTHONPATH=. python bench/int4_ws.py --out bench/results/int4-roofline-ws-h200.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import time
from typing import Any

from bench.common import write_result
from bench.int4_roofline import (
    GROUP,
    SHAPES,
    Bench,
    copy_bandwidth_gbs,
    graph_time_us,
    interleaved_samples_us,
    make_targets,
    medians_of,
)
from kernels.quant.quant_ws_rules import loader_regs

PRIOR = "bench/results/int4-roofline-xtma-h200.json"
MAX_ERROR = 2e-2


def candidates(m: int, bits: int = 4) -> list[dict[str, int]]:
    """Configs of the Gluon kernel for M rows (the smallest BLOCK_M that holds them, 64 above): at M <= 16
    two or three stages (deeper rings start the decode later and measured slower) over 2-4 programs an SM, the
    words' shared memory swizzled or not, one wgmma wait a span or one a slice pair (``SLICE_WAIT``, which keeps
    a 256-column tile's decoded registers few enough for 3 programs an SM without ptxas serializing the wgmmas);
    at M = 64 one or two programs of 3-4 stages; each with X's span in 16-column boxes or 64-column ones
    (``WIDE_X``: 2 copies a span instead of 8, 128-byte swizzled). ``STAGGER`` measured slower and is left out."""
    block_m = next((b for b in (8, 16, 32, 64) if m <= b), 64)
    if block_m <= 16:
        grid = itertools.product((128, 256), (2, 3, 4, 6), (2, 3, 4), (1,) if bits == 4 else (0,),
                                 (1,) if bits == 4 else (0, 1), (0, 1), (0, 1))  # fmt: skip
    else:
        # 256-column tiles: at 64 rows only these escape kernels.quant.quant_ws_rules.accumulators_spill (one program an
        # SM, the scales applied in the decode); the same restriction is kept at 32 rows, where the sm_90 SASS
        # spills only at two programs with SCALE_ACC (60 instructions): a wider 32-row grid waits for a GPU run
        grid = itertools.chain(itertools.product((128,), (3, 4), (1, 2), (0, 1), (1,), (0, 1), (0, 1)),
                               itertools.product((256,), (3, 4), (1,), (0,), (1,), (0, 1), (0, 1)))  # fmt: skip
    out = []
    for bn, stages, programs, scale_acc, swizzle, slice_wait, wide_x in grid:
        out.append({"BLOCK_N": bn, "BLOCK_M": block_m, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
                    "LOADER_REGS": loader_regs(programs), "SCALE_ACC": scale_acc, "SWIZZLE": swizzle,
                    "SLICE_WAIT": slice_wait, "WIDE_X": wide_x})  # fmt: skip
    if block_m == 64 and bits == 4:  # the decoded span through shared memory as wgmma's B operand
        for bn, stages, programs, swizzle in itertools.product((64, 128, 256), (2, 3, 4), (1, 2), (0, 1)):
            out.append({"BLOCK_N": bn, "BLOCK_M": 64, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
                        "LOADER_REGS": loader_regs(programs), "SWIZZLE": swizzle, "UNSWAPPED": 1})  # fmt: skip
    return out


def _compile(job: dict[str, Any]) -> tuple[str, str | None]:
    try:
        from kernels.quant.quant_gemm_ws import check_config, compile_only

        m, n, k = job["shape"]
        reason = check_config(m, n, k, job["bits"], GROUP, **job["config"])
        if reason:
            return job["key"], reason
        compile_only(m, n, k, bits=job["bits"], group_size=GROUP, **job["config"])
        return job["key"], None
    except Exception as exc:  # reported per candidate
        return job["key"], f"{type(exc).__name__}: {exc}"[:300]


def _key(bits: int, m: int, n: int, k: int, config: dict[str, int]) -> str:
    return f"int{bits} {m}x{n}x{k} " + " ".join(f"{name}={value}" for name, value in sorted(config.items()))


def precompile(plan: list[tuple[int, int, int, int]], workers: int) -> dict[str, str]:
    """Compile every candidate of the plan (bits, n, k, m) in worker processes; failures by key."""
    return compile_jobs([(bits, m, n, k, c) for bits, n, k, m in plan for c in candidates(m, bits)], workers)


def compile_jobs(cases: list[tuple[int, int, int, int, dict[str, int]]], workers: int) -> dict[str, str]:
    """Compile each (bits, m, n, k, config) in a spawned process pool; the reasons of those that fail, by key."""
    jobs = [{"key": _key(bits, m, n, k, c), "shape": (m, n, k), "bits": bits, "config": c}
            for bits, m, n, k, c in cases]  # fmt: skip
    failed: dict[str, str] = {}
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for key, error in pool.map(_compile, jobs, chunksize=2):
            if error:
                failed[key] = error
    print(f"compiled {len(jobs) - len(failed)} of {len(jobs)} configs", flush=True)
    return failed


def ws_fn(bench: Bench, x: Any, config: dict[str, int]) -> tuple[Any, int]:
    import torch

    from kernels.quant.quant_gemm_ws import ws_quant_matmul

    out = torch.empty(x.shape[0], bench.n, device="cuda", dtype=x.dtype)
    return bench.rotating(bench.packed, lambda w: ws_quant_matmul(x, w, out=out, **config))


def prior_winners(path: str) -> dict[tuple[int, int, int, int], dict[str, int]]:
    """(bits, n, k, m) -> the packed kernel's winning config in a results file of bench/int4_roofline.py."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        entries = json.load(f).get("shapes", [])
    return {(e["bits"], e["n"], e["k"], e["m"]): e["best_packed"]["config"] for e in entries if e.get("best_packed")}


def measure(bench: Bench, m: int, failed: dict[str, str], prior: dict[str, int] | None, rounds: int,
            pdl: bool = False) -> dict:  # fmt: skip
    from kernels.quant.quant_gemm_ws import ws_quant_matmul

    x = bench.x(m)
    rows = []
    for config in candidates(m, bench.bits):
        key = _key(bench.bits, m, bench.n, bench.k, config)
        if key in failed:
            rows.append({"config": config, "status": "skipped", "why": failed[key]})
            continue
        try:
            error = bench.error(x, ws_quant_matmul(x, bench.packed[0], **config))
            if not error <= MAX_ERROR:
                rows.append({"config": config, "status": "wrong", "error": error})
                continue
            rows.append(
                {"config": config, "status": "ok", "error": error, "us": graph_time_us(*ws_fn(bench, x, config))}
            )
        except Exception as exc:  # a config that fails at run time is reported, not fatal
            rows.append({"config": config, "status": "error", "why": f"{type(exc).__name__}: {exc}"[:300]})
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["us"])
    fns = {"bf16_matmul": bench.dense_fn(x)}
    if ok:
        fns["ws"] = ws_fn(bench, x, ok[0]["config"])
        if pdl:  # the same config as programmatic dependent launches: each product's words stream under the last's end
            fns["ws_pdl"] = ws_fn(bench, x, {**ok[0]["config"], "PDL": 1})
    if prior:
        fns["packed_prior"] = bench.packed_fn(x, prior)
    samples = interleaved_samples_us(fns, rounds)
    final = medians_of(samples)
    ours = {name: final[name] for name in ("ws", "packed_prior") if name in final}
    winner = min(ours, key=ours.get) if ours else None
    if winner:
        final["packed"], samples["packed"] = final[winner], samples[winner]
    return {"x": x, "rows": rows, "ok": ok, "final": final, "samples": samples, "winner": winner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 2))
    parser.add_argument("--ms", default="1,16,64")
    parser.add_argument("--bits", default="4,8", help="int4 at --ms, int8 at M = 1")
    parser.add_argument("--prior", default=PRIOR)
    parser.add_argument("--quick", action="store_true", help="one shape (smoke run)")
    parser.add_argument("--pdl", action="store_true",
                        help="also time each winner as programmatic dependent launches (ws_pdl; not in the targets)")
    args = parser.parse_args()
    import torch

    started = time.time()
    ms = [int(v) for v in args.ms.split(",")]
    shapes = SHAPES[:1] if args.quick else SHAPES
    widths = sorted({int(b) for b in args.bits.split(",")})
    plan = [(4, n, k, m) for n, k in shapes for m in ms if 4 in widths]
    plan += [(8, n, k, 1) for n, k in shapes if 8 in widths]
    failed = precompile(plan, args.workers)
    prior = prior_winners(args.prior)
    bandwidth = copy_bandwidth_gbs()
    print(f"copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    entries: list[dict[str, Any]] = []
    for bits in widths:
        for n, k in shapes:
            bench = Bench(n, k, bits)
            for m in ms if bits == 4 else [1]:
                got = measure(bench, m, failed, prior.get((bits, n, k, m)), args.rounds, args.pdl)
                final, best = got["final"], got["ok"][0] if got["ok"] else None
                ours = final.get("packed")
                entries.append({
                    "bits": bits, "n": n, "k": k, "m": m, "weight_bytes": bench.weight_bytes,
                    "interleaved_us": final, "interleaved_samples_us": got["samples"], "winner": got["winner"],
                    "best_ws": best,
                    "prior_packed_config": prior.get((bits, n, k, m)),
                    "speedup_vs_bf16": final["bf16_matmul"] / ours if ours else None,
                    "ws_speedup_vs_bf16": final["bf16_matmul"] / final["ws"] if "ws" in final else None,
                    "ws_pdl_speedup_vs_bf16": final["bf16_matmul"] / final["ws_pdl"] if "ws_pdl" in final else None,
                    "bandwidth_fraction": bench.weight_bytes / (ours * 1e-6) / (bandwidth * 1e9) if ours else None,
                    "top": got["ok"][:8], "not_ok": [r for r in got["rows"] if r["status"] != "ok"][:12],
                    "best_unswapped": next((r for r in got["ok"] if r["config"].get("UNSWAPPED")), None),
                })  # fmt: skip
                print(f"int{bits} M={m} N={n} K={k}: {final} winner {got['winner']}", flush=True)
                save(entries, bandwidth, failed, started, args.out)
            del bench
            torch.cuda.empty_cache()
    save(entries, bandwidth, failed, started, args.out, copy_bandwidth_gbs())


def save(entries: list[dict[str, Any]], bandwidth: float, failed: dict[str, str], started: float, out: str | None,
         bandwidth_end: float | None = None) -> None:  # fmt: skip
    """Write what is measured so far (after every case, so a run cut short keeps its results)."""
    targets = make_targets(entries)
    write_result(
        {
            "what": "warp-specialized Gluon int4/int8 GEMM (group 128, bf16 activations) vs bf16 torch.matmul and "
            "the packed Triton kernel's prior winners; 'packed' in interleaved_us is the faster of ours",
            "copy_bandwidth_gbs": bandwidth,
            "copy_bandwidth_end_gbs": bandwidth_end,
            "compile_failures": len(failed),
            "compile_failure_examples": list(failed.items())[:10],
            "wall_s": time.time() - started,
            "shapes": entries,
            "targets": targets,
            "summary": [{k: t[k] for k in ("target", "ratio", "verdict")} for t in targets],
        },
        out,
    )


if __name__ == "__main__":
    main()
