"""Which kernels the libraries run at the issue's target shapes: cuBLAS under ``torch.matmul`` (bf16, fp16) and
``torch._scaled_mm`` (fp8), and cuDNN under SDPA, with each kernel's median duration.

A kernel's name says its tile, cluster shape and schedule (e.g. ``..._tilesize128x256x64_cluster2x1x1_...``):
what the library does at a shape our kernels miss. ``torch.profiler`` records 10 calls a case after 5 unrecorded.

    PYTHONPATH=. python bench/library_kernels.py --out bench/results/library-kernels-h200.json
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

GEMMS = ((8192, 8192, 8192), (8192, 14336, 4096), (8192, 4096, 4096))
ATTENTION = tuple((s, d, causal) for d in (128, 64) for s in (1024, 2048) for causal in (True, False))


def kernels_of(call: Any) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name].append(e.time_range.elapsed_us())
    return [{"name": name, "calls": len(t), "median_us": statistics.median(t)} for name, t in times.items()]


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.common import write_result

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    for m, n, k in GEMMS:
        for precision in ("bf16", "fp16", "fp8"):
            if precision == "fp8" and (m, n, k) != (8192, 8192, 8192):
                continue
            if precision == "fp8":
                a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
                one = torch.ones((), device="cuda")

                def call(a=a, b=b, one=one) -> Any:
                    return torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)
            else:
                dtype = torch.bfloat16 if precision == "bf16" else torch.float16
                a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)

                def call(a=a, b=b) -> Any:
                    return a @ b

            found = kernels_of(call)
            for row in found:
                row["tflops"] = 2 * m * n * k / (row["median_us"] * 1e-6) / 1e12
            rows.append({"case": f"gemm {precision} {m}x{n}x{k}", "kernels": found})
            print(rows[-1], flush=True)
    for s, d, causal in ATTENTION:
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)

        def call(q=q, k=k, v=v, causal=causal) -> Any:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        found = kernels_of(call)
        for row in found:
            row["tflops"] = flops / (row["median_us"] * 1e-6) / 1e12
        rows.append({"case": f"sdpa cudnn bf16 B={b} H={h} S={s} D={d} {'causal' if causal else 'full'}",
                     "kernels": found})  # fmt: skip
        print(rows[-1], flush=True)
    write_result({"what": __doc__.split("\n\n")[0], "rows": rows}, args.out)


if __name__ == "__main__":
    main()
