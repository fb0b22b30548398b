"""Forward + backward of the project's attention kernel (kernels/attention/attention_grad.py) against SDPA's backends.

What ``train_step``'s ``attention: triton`` costs per layer: one causal attention of the ``1b``
preset's shape (``--batch`` sequences of 2048 tokens, 16 heads of 128, bf16), forward and
backward, timed with ``tuner.workloads.measure.time_fn`` (CUDA events, L2 flushed) for the project's kernel
and for SDPA's flash and cuDNN backends, interleaved ``--rounds`` times. Reports TFLOP/s (the
forward's FLOPs x 3.5, FlashAttention-2's count for forward + backward, halved when causal) and
the ratio to each backend; also each backend's gradient error against fp32 SDPA (math) on the
same inputs.

    PYTHONPATH=. python bench/attention_backward.py --out bench/results/attention-backward-h200.json
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import interleaved, median, write_result

#: Forward + backward FLOPs over forward FLOPs (FlashAttention-2's accounting: 2.5 x for the backward).
FWD_BWD_FACTOR = 3.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--full", action="store_true", help="non-causal attention (default: causal)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.attention import attention_flops
    from kernels.attention.attention_grad import flash_attention, reference_attention_grads
    from models.gpt import TRITON_ATTENTION_CONFIG
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn

    device = device_info()
    causal = not args.full
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    grad_out = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    leaves = [t.clone().requires_grad_(True) for t in inputs]

    def sdpa(backend: Any) -> Any:
        def run() -> Any:
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)

        return run

    forwards = {
        "triton": lambda: flash_attention(*leaves, causal=causal, **TRITON_ATTENTION_CONFIG),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }

    def step(forward: Any) -> None:
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_out)

    # Gradient errors against fp32 math SDPA.
    _, *ref_grads = reference_attention_grads(*inputs, grad_out, causal)
    errors = {}
    for name, forward in forwards.items():
        step(forward)
        errors[name] = {
            f"d{x}": float((leaf.grad.float() - ref).abs().max() / ref.abs().max())
            for x, leaf, ref in zip("qkv", leaves, ref_grads, strict=True)
        }
    flops = attention_flops(*shape, causal) * FWD_BWD_FACTOR

    def measure(forward: Any) -> Any:
        return lambda: flops / time_fn(lambda: step(forward), device, target_rel_ci=0.02).median_ms / 1e9

    values = interleaved({name: measure(forward) for name, forward in forwards.items()}, rounds=args.rounds)
    tflops = {name: median(v) for name, v in values.items()}
    ratios = {f"triton_vs_{name}": round(tflops["triton"] / v, 3) for name, v in tflops.items() if name != "triton"}
    summary = {"tflops_fwd_bwd": {k: round(v, 1) for k, v in tflops.items()}, **ratios}
    write_result(
        {
            "benchmark": "attention forward + backward: the project's Triton kernels vs SDPA flash and cuDNN",
            "shape": {"batch": args.batch, "heads": args.heads, "seq_len": args.seq_len, "head_dim": args.head_dim},
            "causal": causal,
            "tiles": {
                "forward": TRITON_ATTENTION_CONFIG,
                "backward": "kernels.attention.attention_grad.BACKWARD_TILES",
            },
            "summary": summary,
            "rounds": values,
            "max_rel_grad_error_vs_fp32": errors,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
