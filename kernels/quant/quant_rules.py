"""The static rules of the tiled weight-only GEMM (:mod:`kernels.quant.quant_gemm`) that need neither torch nor
Triton, so a search space's static check can use them without importing either."""

from __future__ import annotations

from typing import Any


def shared_memory_bytes(config: dict[str, Any]) -> int:
    """Estimated shared memory of a config, in bytes (the space's ``shared_memory`` rule computes the same).

    In the K loop each pipeline stage holds an X tile (2 bytes per element), a packed weight tile (bits / 8
    bytes) and the scales it needs (one row, or one row per stored weight row when BLOCK_K > group_size);
    the decoded 16-bit weight tile is staged once more for ``tl.dot`` (wgmma reads it from shared memory).
    After the loop the accumulator's layout conversion for the store reuses the space (<= 4 bytes per
    element). An upper bound: of 114 configs of the default space compiled for sm_90 with Triton 3.9 (which
    needs no GPU), none needed more; not yet checked against Triton 3.6 on the H200.
    """
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    bits, group = int(config["bits"]), int(config["group_size"])
    scale_rows = bk * bits // 8 if bk > group else 1
    per_stage = bm * bk * 2 + bk * bn * bits // 8 + bn * 2 * scale_rows
    return max(int(config["num_stages"]) * per_stage + bk * bn * 2, bm * bn * 4)
