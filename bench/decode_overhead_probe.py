"""Where a decode step's time goes: kernels per step, and what ``torch.compile`` of the step saves.

For the ``1b`` preset (random weights: speed only), bf16 and int4 (group 128) weights, batch 1 and 8:
the CUDA-graph replay time of one decode step (as ``decode_step`` times it), the number of kernels one
eager step launches (``torch.profiler``), the weight bytes over the HBM bandwidth as the floor, and
the same with the step compiled by ``torch.compile`` (default mode, then captured in the same graph).

    PYTHONPATH=. python bench/decode_overhead_probe.py --out decode-overhead.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.common import write_result
from models.config import PRESETS
from models.gpt import make_model
from models.quant_linear import autotune_tiles, parameter_bytes, quantize_decoder

PROMPT = 512
STEPS = 64


def _kernels_per_step(step: Any) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def _graph_ms(step: Any, pos: torch.Tensor) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            pos.fill_(PROMPT)
            step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    pos.fill_(PROMPT)
    with torch.cuda.graph(graph):
        step()
    times = []
    for _ in range(5):
        pos.fill_(PROMPT)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(STEPS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / STEPS)
    return sorted(times)[len(times) // 2]


def probe(model: Any, batch: int, compiled: bool) -> dict[str, Any]:
    cfg = model.cfg
    cache = model.init_cache(batch, PROMPT + STEPS + 1, dtype=torch.bfloat16)
    pos = torch.tensor(PROMPT, device="cuda")
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
    decode = torch.compile(model.decode, dynamic=False) if compiled else model.decode
    out = torch.empty(batch, 1, cfg.vocab_size, device="cuda", dtype=torch.float32)

    def step() -> None:
        out.copy_(decode(tokens, cache, pos))
        pos.add_(1)

    with torch.no_grad():
        t0 = time.monotonic()
        pos.fill_(PROMPT)
        step()
        torch.cuda.synchronize()
        first_s = time.monotonic() - t0
        pos.fill_(PROMPT)
        kernels = _kernels_per_step(step)
        ms = _graph_ms(step, pos)
    return {"ms_per_step": ms, "tokens_per_s": batch / ms * 1e3, "kernels_per_step": kernels, "first_step_s": first_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--hbm-tb-s", type=float, default=4.8, help="HBM bandwidth for the floor")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    base = make_model(PRESETS[args.model], 0, "cuda", dtype=torch.bfloat16).eval()
    variants = {"bf16": base, "int4-g128": quantize_decoder(base, 4, 128)}
    rows = []
    for name, model in variants.items():
        weight_bytes = parameter_bytes(model)
        for batch in args.batches:
            autotune_tiles(model, batch)
            for compiled in (False, True):
                torch._dynamo.reset()
                try:
                    row = probe(model, batch, compiled)
                except Exception as exc:  # report and go on: the probe asks whether compile helps
                    row = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                row.update(
                    weights=name,
                    batch=batch,
                    compiled=compiled,
                    weight_bytes=weight_bytes,
                    floor_ms=weight_bytes / (args.hbm_tb_s * 1e12) * 1e3,
                )
                print(row, flush=True)
                rows.append(row)
    write_result(
        {
            "benchmark": "decode step: kernels per step, CUDA-graph replay time, torch.compile",
            "model": args.model,
            "prompt_len": PROMPT,
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
