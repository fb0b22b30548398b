"""One decode step's attention over the KV cache, layer by layer: SDPA (the model's path) against the split
decode kernel (``kernels/attention/decode_attention.py``), at the 1B preset's shapes (16 heads of 128, prompt 512 + 64
decoded tokens: a 576-position cache, ``pos`` 543, the middle of the decoded tokens).

Per batch (1, 8, 64) and cache dtype (bf16, fp8 e4m3), both paths do what a decode step's attention does for
each of the 18 layers, each layer with its own cache (so the caches do not sit in L2 between layers):

- ``sdpa``: :meth:`models.gpt.KVCache.write_at` (``index_copy_`` of the step's k and v), :meth:`~KVCache.read`
  (an fp8 cache dequantized to bf16 first) and SDPA with the boolean mask over all 576 positions, as
  ``CausalSelfAttention.decode`` runs it with ``attention: sdpa``;
- ``flash_decode_{block_n}x{num_warps}``: :func:`kernels.attention.decode_attention.decode_attention` (the write fused;
  positions past ``pos`` not read) at each of :data:`KERNEL_CONFIGS`, and the default one as programmatic
  dependent launches (``_pdl``: each layer's split kernel reads its first cache rows while the layer before ends);
  the fastest is the one compared.

Each is captured in a CUDA graph of the 18 layers, timed by :func:`tuner.workloads.measure.time_fn`, the two interleaved
over ``--rounds`` rounds; reported per layer with the bytes each path must read (positions ``0..pos`` of k and v)
over its time. ``targets``: the kernel's speed-up over SDPA per case (goal 1.0: no slower).

    PYTHONPATH=. python bench/decode_attention.py --out bench/results/decode-attention-h200.json
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import median, verdict, write_result

HEADS, HEAD_DIM, MAX_LEN, LAYERS, POS = 16, 128, 576, 18, 543
#: The kernel's (block_n, num_warps) timed: the default first.
#: (64, 4) and (128, 8) spill in the sm_90 SASS (18-22 instructions: a 64-row slot accumulator per 4 warps).
KERNEL_CONFIGS = ((32, 4), (16, 4), (16, 2), (32, 8), (64, 8))


def _layers(batch: int, cache_dtype: Any) -> tuple[Any, list[Any]]:
    """The model's cache for ``batch`` sequences (random contents, fp8 scales as a prefill would set them) and one
    qkv projection a layer."""
    import torch

    from models.gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=256, n_layers=LAYERS, d_model=HEADS * HEAD_DIM, n_heads=HEADS, seq_len=2048)
    with torch.device("meta"):
        model = GPT(cfg)
    cache = model.init_cache(batch, MAX_LEN, cache_dtype, "cuda")
    for layer in range(LAYERS):
        k, v = (torch.randn(batch, HEADS, MAX_LEN, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        cache.write_prefix(layer, k, v)
    qkv = [torch.randn(batch, 1, 3 * HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    return cache, qkv


def _paths(batch: int, cache_dtype: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from kernels.attention.decode_attention import decode_attention

    cache, qkv = _layers(batch, cache_dtype)
    index = torch.tensor([POS], device="cuda")
    mask = (cache.positions <= index).view(1, 1, 1, -1)

    def sdpa() -> None:
        for layer in range(LAYERS):
            q, k, v = qkv[layer].view(batch, 1, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
            cache.write_at(layer, k, v, index)
            k_all, v_all = cache.read(layer, torch.bfloat16)
            F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)

    def flash(block_n: int, num_warps: int, pdl: bool = False) -> Any:
        def run() -> None:
            for layer in range(LAYERS):
                decode_attention(qkv[layer], cache.k[layer], cache.v[layer], cache.k_scale[layer],
                                 cache.v_scale[layer], index, HEADS, block_n, num_warps, pdl)  # fmt: skip

        return run

    kernels = {f"flash_decode_{bn}x{w}": flash(bn, w) for bn, w in KERNEL_CONFIGS}
    return {"sdpa": sdpa, **kernels, "flash_decode_32x4_pdl": flash(32, 4, pdl=True)}


def measure(batches: list[int], dtypes: list[str], rounds: int) -> dict[str, Any]:
    import torch

    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn

    device = device_info()
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for batch in batches:
        for name in dtypes:
            cache_dtype = getattr(torch, name)
            paths = _paths(batch, cache_dtype)
            samples: dict[str, list[float]] = {path: [] for path in paths}
            for _ in range(rounds):
                for path, fn in paths.items():
                    timing = time_fn(fn, device, cuda_graph=True, graph_calls=4, flush_l2=True, rep_ms=200.0)
                    samples[path].append(timing.median_ms * 1e3 / LAYERS)
            us = {path: median(values) for path, values in samples.items()}
            read = 2 * batch * HEADS * (POS + 1) * HEAD_DIM * torch.tensor([], dtype=cache_dtype).element_size()
            row = {"batch": batch, "cache": name, "us_per_layer": us, "samples_us": samples,
                   "read_bytes_per_layer": read,
                   "tb_per_s": {path: read / (t * 1e-6) / 1e12 for path, t in us.items() if t}}  # fmt: skip
            rows.append(row)
            best = min((p for p in us if p != "sdpa" and us[p]), key=lambda p: us[p], default=None)
            row["best_kernel_config"] = best
            ratio = us["sdpa"] / us[best] if best and us["sdpa"] else None
            targets.append({"target": f"decode attention, batch {batch}, {name} cache: split kernel ({best}) vs SDPA",
                            "tuned": us.get(best), "baseline": us["sdpa"], "ratio": ratio, "goal": 1.0,
                            "verdict": verdict(ratio, 1.0)})  # fmt: skip
            print(f"batch {batch} {name}: " + ", ".join(f"{p} {t:.2f}" for p, t in us.items() if t) + " us a layer",
                  flush=True)  # fmt: skip
    return {"what": __doc__.splitlines()[0], "rows": rows, "targets": targets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float8_e4m3fn"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    ns = parser.parse_args()
    write_result(measure(ns.batches, ns.dtypes, ns.rounds), ns.out)


if __name__ == "__main__":
    main()
