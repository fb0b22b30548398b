"""Launch one tuned kernel a few times, for a profiler (``ncu``) to read its counters.

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --launch-skip 3 --launch-count 1 -k regex:attention_fwd python bench/profile_kernel.py attention

``attention``: the attention winner at S=4096, D=128, causal (B 4, H 16, bf16); ``gemm``: the bf16 GEMM
winner at 8192 x 4096 x 4096. Both as measured in ``bench/results/kernel-variants-h200.json``.
``attention '{"shape": {"batch": 16, "heads": 16, "seq_len": 1024, "head_dim": 128, "causal": true},
"config": {...}}'``: any ``flash_attention`` shape and config (e.g. the ``gluon_ws`` winner, ``-k regex:ws``).
``quant '{"m": 1, "n": 4096, "k": 14336, "bits": 4, "config": {...}}'``: the packed weight-only GEMM
(:mod:`kernels.quant.quant_gemm_packed`, group 128, bf16) with that tile (``-k regex:packed_quant``).
``quant_ws '{"m": 1, "n": 14336, "k": 4096, "bits": 4, "config": {...}}'``: the warp-specialized Gluon
weight-only GEMM (:mod:`kernels.quant.quant_gemm_ws`) with that config (``-k regex:ws_quant``).
``sdpa '{"batch": 16, "heads": 32, "seq_len": 1024, "head_dim": 64, "causal": true}'``: the baseline, SDPA's cuDNN
backend at that shape (bf16; ``-k regex:sdpa``), to read beside a tuned kernel's counters.
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch

    from tuner.workloads.fingerprint import device_info

    which = sys.argv[1] if len(sys.argv) > 1 else "attention"
    if which in ("quant", "quant_ws"):
        return quant(sys.argv[2], ws=which == "quant_ws")
    if which == "sdpa":
        return sdpa(sys.argv[2])
    device = device_info()
    if which == "attention":
        from objectives.flash_attention import FlashAttention

        workload = FlashAttention(batch=4, heads=16, seq_len=4096, head_dim=128, causal=True)
        config = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "precision": "bf16",
                  "kernel": "tutorial", "use_tma": True}  # fmt: skip
        if len(sys.argv) > 2:
            import json

            case_json = json.loads(sys.argv[2])
            workload, config = FlashAttention(**case_json["shape"]), case_json["config"]
    else:
        from objectives.triton_gemm import TritonGemm

        workload = TritonGemm(m=8192, n=4096, k=4096)
        config = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4,
                  "precision": "bf16", "pad_k": False, "kernel": "persistent_tma_ws",
                  "EPILOGUE_SUBTILE": True}  # fmt: skip
    case = workload._case(config, device)
    for _ in range(6):
        workload._launch(config, case)
    torch.cuda.synchronize()
    print(workload._check(config, case))


def quant(case_json: str, ws: bool = False) -> None:
    """Launch the packed weight-only GEMM of ``case_json`` (or the Gluon one, ``ws``) six times on fresh
    standard-normal operands."""
    import json

    import torch

    from kernels.quant.quant_gemm_packed import packed_matmul, quantize_packed
    from kernels.quant.quant_gemm_ws import ws_quant_matmul

    case = json.loads(case_json)
    w = torch.randn(case["k"], case["n"], device="cuda") * 0.02
    weights = quantize_packed(w, case["bits"], 128, torch.bfloat16)
    x = torch.randn(case["m"], case["k"], device="cuda").to(torch.bfloat16)
    for _ in range(6):
        y = (ws_quant_matmul if ws else packed_matmul)(x, weights, **case["config"])
    torch.cuda.synchronize()
    ref = x.float() @ weights.dequantize()
    print("max rel error", float((y.float() - ref).abs().max() / ref.abs().max()))


def sdpa(shape_json: str) -> None:
    """Launch SDPA's cuDNN backend six times at ``shape_json`` (bf16 standard-normal Q, K, V)."""
    import json

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = json.loads(shape_json)
    dims = (shape["batch"], shape["heads"], shape["seq_len"], shape["head_dim"])
    q, k, v = (torch.randn(dims, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(6):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=shape["causal"])
    torch.cuda.synchronize()
    print("cuDNN output finite:", bool(out.isfinite().all()))


if __name__ == "__main__":
    main()
