"""Programmatic dependent launch for the int4 products of a decode step: does it save launch latency?

At the 1B model's decode shapes (2-8 MB of words a product) the int4 kernels take 1.6-2.3x the time their words
take to read (``bench/decode_shapes.py``): launch and pipeline fill are a large share of a 4-8 us kernel. A
programmatic dependent launch (Hopper) schedules a kernel's programs while the kernel before it drains; they wait
(``griddepcontrol.wait``) before reading what it wrote. The packed kernel's ``PDL`` waits before its first load;
the warp-specialized kernel's ``PDL`` copies the ring's first lap of words and scales (which no kernel writes)
before the wait and only X after it, and lets its own dependents launch once its copies are issued.

Per row count, one CUDA graph per variant runs ``--layers`` layers' four products (each layer its own weights),
each behind a kernel that writes its X (as the norms and the attention before them do in a decode step): eager
(``torch.mul``, which never lets a dependent launch early) or, for the ``*_inductor`` variants, a torch.compile'd
kernel with Inductor's PDL code (it lets its dependents launch once its loads are done, and is launched as a
dependent itself). The variants are timed in turn ``--rounds`` times (medians) and their outputs compared with the
first's. The tiles are those the decode tuner picked on an H200 (``int4-roofline-decode-shapes-slicewait``).

    PYTHONPATH=. python bench/int4_pdl.py --rows 8 64 --out bench/results/int4-roofline-pdl-ws-h200.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import interleaved, median, write_result

SHAPES = {"qkv": (6144, 2048), "attn_out": (2048, 2048), "mlp_up": (8192, 2048), "mlp_down": (2048, 8192)}
_SWAPPED = {"num_warps": 4, "num_stages": 3, "PREFETCH": 0, "TMA": 2, "SWAP": 2}
#: The packed kernel's picks of the decode tuner on an H200 (mlp_down at M = 8 took a warp-specialized tile; the
#: packed split-K tile stands in for it here).
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
_WS8 = {"BLOCK_M": 8, "SCALE_ACC": 1, "SWIZZLE": 1, "SLICE_WAIT": 1}
_WS64 = {"BLOCK_M": 64, "BLOCK_N": 128, "NUM_STAGES": 3, "PROGRAMS_PER_SM": 1, "LOADER_REGS": 40, "SWIZZLE": 1,
         "SLICE_WAIT": 1}  # fmt: skip
#: The warp-specialized kernel's picks of the decode tuner at M = 8 (the fastest WS tile of each shape); at M = 64
#: one swapped 128-column tile for every shape.
WS_TILES: dict[int, dict[str, dict[str, int]]] = {
    8: {"qkv": {**_WS8, "BLOCK_N": 128, "NUM_STAGES": 2, "PROGRAMS_PER_SM": 2, "LOADER_REGS": 40},
        "attn_out": {**_WS8, "BLOCK_N": 256, "NUM_STAGES": 2, "PROGRAMS_PER_SM": 1, "LOADER_REGS": 40},
        "mlp_up": {**_WS8, "BLOCK_N": 128, "NUM_STAGES": 3, "PROGRAMS_PER_SM": 3, "LOADER_REGS": 24},
        "mlp_down": {**_WS8, "BLOCK_N": 128, "NUM_STAGES": 2, "PROGRAMS_PER_SM": 2, "LOADER_REGS": 40}},
    64: {name: dict(_WS64) for name in SHAPES},
}  # fmt: skip
#: Variants: (kernel, PDL, X's writer).
VARIANTS: dict[str, tuple[str, int, str]] = {
    "packed": ("packed", 0, "eager"),
    "packed_pdl": ("packed", 1, "eager"),
    "ws": ("ws", 0, "eager"),
    "ws_pdl": ("ws", 1, "eager"),
    "ws_inductor": ("ws", 0, "inductor"),
    "ws_pdl_inductor": ("ws", 1, "inductor"),
}


def _writer(kind: str) -> Any:
    """The kernel that writes a product's X: ``torch.mul`` eagerly, or Inductor's kernel with its PDL code."""
    import torch

    def scale(source: torch.Tensor, x: torch.Tensor) -> None:
        torch.mul(source, 1.0, out=x)

    if kind == "eager":
        return scale

    @torch.compile(dynamic=False, options={"triton.enable_pdl": True})
    def inductor(source: torch.Tensor, x: torch.Tensor) -> None:
        x.copy_(source * 1.0)  # one kernel writing x in place

    return inductor


def layer_graphs(rows: int, layers: int, variants: list[str]) -> dict[str, Any]:
    """One graph per variant over the same weights and inputs, and each output's largest difference from the
    first variant's."""
    import torch

    from kernels.quant.quant_gemm_packed import packed_matmul, quantize_packed
    from kernels.quant.quant_gemm_ws import ws_quant_matmul

    torch.manual_seed(0)
    products = []  # every layer its own weights (12 MB of words a layer): the step streams them from HBM
    for _ in range(layers):
        for name, (n, k) in SHAPES.items():
            weights = quantize_packed(torch.randn(k, n, device="cuda") / k**0.5, 4, 128, scale_dtype=torch.bfloat16)
            source = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            products.append((name, weights, source, torch.empty_like(source), y))
    graphs, outputs = {}, {}
    for variant in variants:
        kernel, pdl, writer_kind = VARIANTS[variant]
        writer = _writer(writer_kind)

        def step(kernel: str = kernel, pdl: int = pdl, writer: Any = writer) -> None:
            for name, weights, source, x, y in products:
                writer(source, x)
                if kernel == "packed":
                    packed_matmul(x, weights, out=y, PDL=pdl, **TILES[rows][name])
                else:
                    ws_quant_matmul(x, weights, out=y, PDL=pdl, **WS_TILES[rows][name])

        step()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        graphs[variant] = graph
        outputs[variant] = [p[4].clone() for p in products]
    first = outputs[variants[0]]
    errors = {
        v: max((a.float() - b.float()).abs().max().item() for a, b in zip(first, got, strict=True))
        for v, got in outputs.items()
    }
    return {"graphs": graphs, "max_difference": errors}


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
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out")
    args = parser.parse_args()
    started = time.time()
    rows_out = []
    for rows in args.rows:
        built = layer_graphs(rows, args.layers, args.variants)
        samples = interleaved({v: (lambda g=g: us_per_layer(g, args.layers))
                               for v, g in built["graphs"].items()}, args.rounds)  # fmt: skip
        medians = {name: median(v) for name, v in samples.items()}
        rows_out.append({"rows": rows, "tiles": TILES[rows], "ws_tiles": WS_TILES[rows], "us_per_layer": medians,
                         "samples": samples, "max_difference": built["max_difference"]})  # fmt: skip
        print(f"M={rows}: {medians} (largest differences from {args.variants[0]}: {built['max_difference']})",
              flush=True)  # fmt: skip
        write_result({"what": __doc__.splitlines()[0], "wall_s": time.time() - started, "layers": args.layers,
                      "variants": {v: VARIANTS[v] for v in args.variants}, "rows": rows_out}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
