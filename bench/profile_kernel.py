"""Launch one tuned kernel a few times, for a profiler (``ncu``) to read its counters.

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --launch-skip 3 --launch-count 1 -k regex:attention_fwd python bench/profile_kernel.py attention

``attention``: the attention winner at S=4096, D=128, causal (B 4, H 16, bf16); ``gemm``: the bf16 GEMM
winner at 8192 x 4096 x 4096. Both as measured in ``bench/results/kernel-variants-h200.json``.
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch

    from tuner.fingerprint import device_info

    which = sys.argv[1] if len(sys.argv) > 1 else "attention"
    device = device_info()
    if which == "attention":
        from objectives.flash_attention import FlashAttention

        workload = FlashAttention(batch=4, heads=16, seq_len=4096, head_dim=128, causal=True)
        config = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "precision": "bf16",
                  "kernel": "tutorial", "use_tma": True}  # fmt: skip
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


if __name__ == "__main__":
    main()
