"""Paste a GEMM study's Python export into a fresh script and check that it reproduces the study's speed.

The export (``GET /api/studies/{id}/export?format=python``, or ``tuner export NAME --format python``)
is executed as it is, then its config runs on fresh standard-normal operands of the study's shape,
checked against the library call (``torch.matmul``; ``torch._scaled_mm`` for fp8) and timed with
``triton.testing.do_bench`` (L2 cleared between repetitions, median), beside the library call
timed the same way. Nothing of the tuner is imported: only the kernel module the export names.

    PYTHONPATH=. python bench/reproduce_gemm_export.py --export out/export.py --m 8192 --n 8192 --k 8192 \
        --study-tflops 744.5 --out bench/results/kernel-variants-export-h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def main() -> None:
    import torch
    import triton

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, required=True, help="the study's format=python export")
    parser.add_argument("--m", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--study-tflops", type=float, help="the winner's TFLOP/s in the study, to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()

    source = ns.export.read_text()
    namespace: dict[str, Any] = {}
    exec(compile(source, str(ns.export), "exec"), namespace)  # the export, pasted as it is
    config = dict(namespace["GEMM_CONFIG"])
    matmul = namespace["matmul_persistent"]
    precision = config["precision"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    a32 = torch.randn(ns.m, ns.k, device="cuda", generator=gen)
    b32 = torch.randn(ns.k, ns.n, device="cuda", generator=gen)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    library_name = "torch.matmul"
    if precision == "fp8":
        # Per-tensor scales; B K-major (the transpose of a contiguous (N, K)), as both kernels read it.
        scale_a = (a32.abs().max() / 448.0).float().reshape(1)
        scale_b = (b32.abs().max() / 448.0).float().reshape(1)
        a = (a32 / scale_a).to(torch.float8_e4m3fn)
        b = (b32.t().contiguous() / scale_b).to(torch.float8_e4m3fn).t()
        fast = bool(config.get("fp8_fast_accum", True))
        library_name = "torch._scaled_mm" + (" (use_fast_accum)" if fast else "")

        def tuned() -> Any:
            return matmul(a, b, num_sms=sms, scale_a=scale_a, scale_b=scale_b, **config)

        def library() -> Any:
            return torch._scaled_mm(a, b, scale_a=scale_a.reshape(()), scale_b=scale_b.reshape(()),
                                    out_dtype=torch.bfloat16, use_fast_accum=fast)  # fmt: skip

    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        a, b = a32.to(dtype), b32.to(dtype)

        def tuned() -> Any:
            return matmul(a, b, num_sms=sms, **config)

        def library() -> Any:
            return torch.matmul(a, b)

    ref = library().float()
    error = float((tuned().float() - ref).abs().max() / ref.abs().max())
    flops = 2 * ns.m * ns.n * ns.k
    values: dict[str, list[float]] = {"export": [], library_name: []}
    for _ in range(ns.rounds):  # interleaved: export, library, export, library, ...
        for name, fn in (("export", tuned), (library_name, library)):
            values[name].append(flops / (triton.testing.do_bench(fn, warmup=25, rep=200) * 1e-3) / 1e12)
    medians = {name: sorted(v)[len(v) // 2] for name, v in values.items()}
    result = {
        "shape": {"m": ns.m, "n": ns.n, "k": ns.k},
        "config": {"precision": precision, **config},
        "max_rel_error_vs_torch": error,
        "tflops": values,
        "median_tflops": medians,
        "library": library_name,
        "ratio_vs_library": round(medians["export"] / medians[library_name], 4),
        "study_tflops": ns.study_tflops,
        "ratio_vs_study": round(medians["export"] / ns.study_tflops, 4) if ns.study_tflops else None,
    }
    print(json.dumps(result, indent=2))
    if ns.out:
        ns.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
