"""Programmatic dependent launch for the packed int4 products of a decode step: does it save launch latency?

At the 1B model's decode shapes (2-8 MB of words a product) the packed kernel takes 1.6-2.3x the time its
words take to read (``bench/decode_shapes.py``): launch and pipeline fill are a large share of a 4-8 us kernel.
With ``PDL=1`` the kernel is launched as a programmatic dependent of the kernel before it (Hopper): its programs
are scheduled as that kernel drains and wait (``griddepcontrol.wait``) only before their first load.

Per row count, one CUDA graph runs ``--layers`` layers' four products (each layer its own weights), each behind an
elementwise kernel that writes its X (as the norms and the attention before them do in a decode step); the
graph with ``PDL=0`` and with ``PDL=1`` are timed in turn ``--rounds`` times (medians), and both outputs are
compared. The tiles are those the decode tuner picked on an H200 (``int4-roofline-decode-shapes-stream``).

    PYTHONPATH=. python bench/int4_pdl.py --rows 8 64 --out bench/results/int4-roofline-pdl-h200.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import interleaved, median, write_result

SHAPES = {"qkv": (6144, 2048), "attn_out": (2048, 2048), "mlp_up": (8192, 2048), "mlp_down": (2048, 8192)}
_SWAPPED = {"num_warps": 4, "num_stages": 3, "PREFETCH": 0, "TMA": 2, "SWAP": 2}
#: The decode tuner's picks on an H200 (mlp_down at M = 8 took a warp-specialized tile; the packed split-K tile
#: stands in for it here).
TILES: dict[int, dict[str, dict[str, int]]] = {
    8: {"qkv": {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 8, **_SWAPPED},
        "attn_out": {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 8, **_SWAPPED},
        "mlp_up": {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 4, **_SWAPPED},
        "mlp_down": {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 8, **_SWAPPED}},
    64: {"qkv": {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 4, **_SWAPPED},
         "attn_out": {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_K": 4, **_SWAPPED},
         "mlp_up": {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1, **_SWAPPED},
         "mlp_down": {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1, "STREAM": 2, **_SWAPPED}},
}  # fmt: skip


def layer_graphs(rows: int, layers: int) -> dict[str, Any]:
    """The two graphs (PDL off / on) over the same weights and inputs, and their outputs' largest difference."""
    import torch

    from kernels.quant_gemm_packed import packed_matmul, quantize_packed

    torch.manual_seed(0)
    products = []  # every layer its own weights (12 MB of words a layer): the step streams them from HBM
    for _ in range(layers):
        for name, (n, k) in SHAPES.items():
            weights = quantize_packed(torch.randn(k, n, device="cuda") / k**0.5, 4, 128)
            source = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            products.append((name, weights, source, torch.empty_like(source), y))
    graphs, outputs = {}, {}
    for pdl in (0, 1):
        def step(pdl: int = pdl) -> None:
            for name, weights, source, x, y in products:
                torch.mul(source, 1.0, out=x)  # the kernel that writes X, as a norm does
                packed_matmul(x, weights, out=y, PDL=pdl, **TILES[rows][name])

        step()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        graphs[pdl] = graph
        outputs[pdl] = [p[4].clone() for p in products]
    error = max((a.float() - b.float()).abs().max().item() for a, b in zip(outputs[0], outputs[1], strict=True))
    return {"graphs": graphs, "max_difference": error}


def us_per_layer(graph: Any, layers: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (10 * layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()
    started = time.time()
    rows_out = []
    for rows in args.rows:
        built = layer_graphs(rows, args.layers)
        samples = interleaved({f"pdl{p}": (lambda g=g: us_per_layer(g, args.layers))
                               for p, g in built["graphs"].items()}, args.rounds)  # fmt: skip
        medians = {name: median(v) for name, v in samples.items()}
        rows_out.append({"rows": rows, "tiles": TILES[rows], "us_per_layer": medians, "samples": samples,
                         "saved_us_per_layer": medians["pdl0"] - medians["pdl1"],
                         "max_difference": built["max_difference"]})  # fmt: skip
        print(f"M={rows}: {medians} (outputs differ by {built['max_difference']})", flush=True)
        write_result({"what": __doc__.splitlines()[0], "wall_s": time.time() - started, "layers": args.layers,
                      "rows": rows_out}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
