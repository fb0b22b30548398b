"""Host time of an attention launch, beside its GPU time: does the warp-specialized kernel's Python launch path
(rules, constexprs, TMA descriptors, Triton's launcher) leak into the timings the benchmarks and the tuner take?

For each shape, the Gluon kernel (:func:`kernels.attention.attention_ws.attention_ws`, one config) and SDPA's cuDNN
backend:

- ``host_us``: the host's time a call, ``--calls`` launches back to back with no synchronization in between
  (median of ``--rounds`` such loops; the GPU's queue is deep enough that the host never waits for it);
- ``events_us``: the GPU time a call as the benchmarks take it (``GPU_TIMING``: CUDA events around each call, L2
  flushed before each);
- ``graph_us``: the same with the calls captured in a CUDA graph, which takes the host out of the timed interval.

A kernel whose ``events_us`` stands above its ``graph_us`` while cuDNN's do not has host time in its event
timings: the launch, not the kernel, set the figure.

    PYTHONPATH=. python bench/attention_host.py --out bench/results/attention-host-h200.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.attention_ws import WINNER_LOOP
from bench.common import write_result

#: The winners' loop with the schedule table and the half diagonal block, and the same without either.
CONFIGS: dict[str, dict[str, Any]] = {
    "ws_lpt_half": {**WINNER_LOOP, "LPT_HEADS": 32, "HALF_DIAG": True},
    "ws_pairs": WINNER_LOOP,
}
#: (batch, heads, seq_len, head_dim, causal): the shortest target shapes, where a launch's host time weighs most.
SHAPES = [(16, 32, 1024, 64, True), (16, 16, 1024, 128, True), (8, 32, 2048, 64, True)]


def host_us(call: Any, calls: int, rounds: int) -> float:
    """The host's microseconds a call: ``calls`` launches without synchronizing, median over ``rounds`` loops."""
    import torch

    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def gpu_us(call: Any, graph: bool) -> float:
    """The GPU's microseconds a call (``GPU_TIMING``; ``graph``: the calls in a CUDA graph)."""
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import GPU_TIMING, time_fn

    return time_fn(call, device_info(), **GPU_TIMING, cuda_graph=graph).median_ms * 1e3


def _candidates(b: int, h: int, s: int, d: int, causal: bool) -> dict[str, Any]:
    """The calls timed at one shape: each config of the Gluon kernel and SDPA's cuDNN backend, on seed-0 inputs."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.attention_ws import attention_ws

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    candidates: dict[str, Any] = {
        name: (lambda c=config: attention_ws(q, k, v, causal=causal, out=out, lse=lse, **c))
        for name, config in CONFIGS.items()
    }

    def cudnn() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    candidates["cudnn"] = cudnn
    return candidates


def measure(calls: int, rounds: int) -> list[dict[str, Any]]:
    """Every shape's rows: host, event and graph microseconds of each candidate."""
    import torch

    rows = []
    for b, h, s, d, causal in SHAPES:
        for name, call in _candidates(b, h, s, d, causal).items():
            call()
            torch.cuda.synchronize()
            row = {"shape": {"batch": b, "heads": h, "seq_len": s, "head_dim": d, "causal": causal}, "name": name,
                   "host_us": round(host_us(call, calls, rounds), 1), "events_us": round(gpu_us(call, False), 1),
                   "graph_us": round(gpu_us(call, True), 1)}  # fmt: skip
            row["events_over_graph"] = round(row["events_us"] / row["graph_us"], 4)
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    rows = measure(ns.calls, ns.rounds)
    summary = {f"{r['name']} S={r['shape']['seq_len']} D={r['shape']['head_dim']}":
               [r["host_us"], r["events_us"], r["graph_us"]] for r in rows}  # fmt: skip
    write_result({"benchmark": "attention launch: host time against GPU time", "configs": CONFIGS, "rows": rows,
                  "summary": summary}, ns.out)  # fmt: skip


if __name__ == "__main__":
    main()
