"""Where one decode step's time goes, kernel by kernel, for the configs ``bench/int4_decode.py`` compares.

Each config runs through the ``decode_step`` workload (its case: model, cache, compiled step, captured CUDA
graph), then ``torch.profiler`` records ``--steps`` replays of the captured graph (the timed path) and the same
steps launched eagerly through the compiled step. Per config: the graph's step time (CUDA events), kernels per
step, the sum of their durations (the rest of the step is launch gaps), and the time by kind of kernel (the
GEMMs of the library or of the packed int4 kernel, attention over the cache, Inductor's fused kernels, other)
with the heaviest kernels by name. The weights are untrained (speed only).

    PYTHONPATH=. python bench/decode_profile.py --batches 1 64 --out bench/results/decode-profile-h200.json
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from typing import Any

from bench.int4_decode import CANDIDATES

#: Kinds of kernel, by name (first match wins).
KINDS: tuple[tuple[str, str], ...] = (
    ("inductor fused", r"^triton_"),  # before the GEMMs: a fused kernel's name holds the ops around it
    ("int4 gemm", r"quant|packed"),
    ("library gemm", r"gemm|gemv|xmma|nvjet|cutlass|splitk|sm90_|cublas"),
    ("attention", r"fmha|flash|attention|efficient|sdpa|softmax|_decode_(split|combine)_kernel"),
    ("copy/fill", r"copy|fill|memcpy|memset|index"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def summarize(events: list[Any], steps: int) -> dict[str, Any]:
    """Kernels of ``steps`` steps: count, summed duration and the span they cover, per step; by kind and name."""
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events]
    if not kernels:
        return {"kernels_per_step": 0}
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, start, end in kernels:
        by_kind[kind_of(name)] += end - start
        by_name[name][0] += 1
        by_name[name][1] += end - start
    busy = sum(end - start for _, start, end in kernels)
    span = max(end for _, _, end in kernels) - min(start for _, start, _ in kernels)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    return {
        "kernels_per_step": len(kernels) / steps,
        "busy_us_per_step": busy / steps,
        "span_us_per_step": span / steps,
        "us_per_step_by_kind": {k: round(v / steps, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": name[:160], "kind": kind_of(name), "per_step": count / steps, "us_per_step": round(t / steps, 2)}
            for name, (count, t) in top
        ],
    }


def profile_config(workload: Any, name: str, batch: int, steps: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tuner.workloads.fingerprint import device_info

    device = device_info()
    config = {**CANDIDATES[name], "batch": batch}
    started = time.time()
    case = workload._case(config, device)
    build_s = time.time() - started
    out: dict[str, Any] = {"config": name, "batch": batch, "build_s": round(build_s, 1)}
    with torch.no_grad():
        # the graph's step time, as the workload times it
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            case.pos.fill_(workload.prompt_len)
            a.record()
            for _ in range(steps):
                case.graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / steps)
        out["graph_us_per_step"] = sorted(times)[len(times) // 2]
        for mode in ("graph", "eager"):
            case.pos.fill_(workload.prompt_len)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    if mode == "graph":
                        case.graph.replay()
                    else:
                        workload._step(case)
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            out[mode] = summarize(events, steps)
    kinds = out["graph"].get("us_per_step_by_kind") or out["eager"].get("us_per_step_by_kind")
    print(f"b{batch} {name}: graph {out['graph_us_per_step']:.1f} us/step; graph kernels "
          f"{out['graph'].get('kernels_per_step')} busy {out['graph'].get('busy_us_per_step')}; {kinds}",
          flush=True)  # fmt: skip
    return out


def main() -> None:
    from bench.common import write_result
    from objectives.decode_step import DecodeStep

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 64])
    parser.add_argument("--names", nargs="*", default=["bf16_compiled", "int4_packed_compiled"])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    started = time.time()
    for batch in args.batches:
        workload = DecodeStep(model="1b", prompt_len=args.prompt_len, gen_tokens=args.steps, batch=batch, seed=0)
        for name in args.names:
            try:
                rows.append(profile_config(workload, name, batch, args.steps))
            except Exception as exc:  # report and go on
                rows.append({"config": name, "batch": batch, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                print(rows[-1], flush=True)
            write_result({"what": __doc__.split("\n\n")[0], "wall_s": time.time() - started, "rows": rows},
                         args.out)  # fmt: skip


if __name__ == "__main__":
    main()
