"""Persistent GEMM ``C = A @ B`` in Gluon for Hopper: a TMA loader warp and two consumer warpgroups that take
turns (CUTLASS's "ping-pong" schedule, as far as this kernel goes).

The Triton kernels of :mod:`kernels.gemm.gemm_tma` leave the schedule to the compiler: with 8 warps the two
warpgroups share every tile (each 64 of its 128 rows), so both run their epilogue at once and the tensor cores
wait while the tile is converted and stored. Here, written out with Gluon's explicit shared memory, barriers
and warp partitions (``triton.experimental.gluon``, Triton >= 3.6, sm_90):

- **Partitions**: a program (one per SM) walks the output tiles ``pid, pid + programs, ...`` in GROUP_M order.
  A one-warp *loader* issues the TMA loads of every tile's K blocks, in that order, into a ring of
  ``NUM_STAGES`` stages (a ``ready`` and an ``empty`` barrier per stage). Consumer ``c`` (one warpgroup of 4
  warps, a whole BLOCK_M x BLOCK_N accumulator in its registers) takes the program's tiles ``c, c + 2, ...``.
  The ring fills in tile order, and a consumer starts a tile's main loop once the other has finished the
  main loop of the tile before (an ``order`` barrier each): the two alternate on the tensor cores, and each
  one's epilogue (convert, store to shared memory, TMA store) runs while the other computes the next tile.
  The order also keeps the stage barriers' parity waits unambiguous: without it a consumer could wait on its
  lap of a stage while the other's lap before it had not landed, and take a parity that was two phases old.
- **Main loop**: per K block, wait for its stage, issue the wgmma, wait until at most one is in flight, then
  free the previous block's stage.
- **Epilogue**: each consumer has its own C buffer in shared memory; the TMA store of one tile drains while
  the consumer computes its next one (``store_wait`` only before the buffer is written again).
- **Registers**: the loader gets 24 per thread, the consumers ``CONSUMER_REGS`` (up to 240: a 128 x 128 fp32
  accumulator is 128 a thread).

bf16 and fp16 in, the same out, fp32 accumulation. A is row-major (M, K), B row-major (K, N), C (M, N); TMA
clips loads (zeros past the edges, any M, N, K) and stores, and needs 16-byte aligned rows (K and N multiples
of 8).
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from kernels.gemm import gemm_tma
from kernels.launch import Descriptors, Plan, PlanCache, layout_key, sm_count
from kernels.runtime import interpreter_active

try:  # Gluon (Triton >= 3.6); the kernel is defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels.gluon_compat import tma_load, tma_store
except ImportError:  # pragma: no cover - older Triton
    gluon = None

#: Precisions (operands and output) and their torch dtypes.
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Tiles the kernel takes: (BLOCK_M, BLOCK_N) per consumer warpgroup, BLOCK_K per stage.
BLOCK_MS = (64, 128)
BLOCK_NS = (64, 128, 256)
BLOCK_KS = (32, 64, 128)
#: Registers per thread over all 12 warps at launch (65,536 / 384 = 170); ``setmaxnreg`` then moves them from
#: the loader (24) to the consumers.
MAXNREG = 168
SMEM_BYTES = 227 * 1024


def available() -> bool:
    """Whether this Triton has Gluon's Hopper API (the kernel compiles only then, and only for sm_90)."""
    return gluon is not None and not interpreter_active()


if gluon is not None:
    #: The Triton kernels' GROUP_M tile order, compiled by Gluon's front end.
    _tile_coords = gluon.jit(gemm_tma._tile_coords.fn)

    @gluon.jit
    def _loader(a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                NUM_STAGES: gl.constexpr):  # fmt: skip
        """One warp: the K blocks of the program's tiles, in order, into the ring."""
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        num_pid_in_group = GROUP_M * num_pid_n
        it = 0
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_in_group, num_pid_m, GROUP_M)
            for ki in range(k_tiles):
                stage = it % NUM_STAGES
                # A fresh barrier's "previous phase" (parity 1) counts as complete: the first lap does not wait.
                mbarrier.wait(empty.index(stage), ((it // NUM_STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(stage), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma_load(a_desc, [pid_m * BLOCK_M, ki * BLOCK_K], ready.index(stage), a_smem.index(stage))
                tma_load(b_desc, [ki * BLOCK_K, pid_n * BLOCK_N], ready.index(stage), b_smem.index(stage))
                it += 1

    @gluon.jit
    def _consumer(c_desc, a_smem, b_smem, c_smem, ready, empty, order, M, N, K, c: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                  NUM_STAGES: gl.constexpr):  # fmt: skip
        """Consumer ``c`` (one warpgroup): the program's tiles ``c, c + 2, ...``, each main loop then epilogue."""
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_N, 16])  # fmt: skip
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        num_pid_in_group = GROUP_M * num_pid_n
        programs = gl.num_programs(0)
        c_buf = c_smem.index(c)
        local = c  # the tile's index among the program's tiles: its K blocks start at ring slot local * k_tiles
        for tile in range(gl.program_id(0) + c * programs, num_pid_m * num_pid_n, 2 * programs):
            pid_m, pid_n = _tile_coords(tile, num_pid_in_group, num_pid_m, GROUP_M)
            base = local * k_tiles
            if local > 0:  # the other consumer's main loop of the tile before is done (see the module docstring)
                mbarrier.wait(order.index(1 - c), ((local - 1) // 2) & 1)
            acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
            for ki in range(k_tiles):
                it = base + ki
                stage = it % NUM_STAGES
                mbarrier.wait(ready.index(stage), (it // NUM_STAGES) & 1)
                a = a_smem.index(stage)
                b = b_smem.index(stage)
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc, a, b = warpgroup_mma_wait(1, deps=(acc, a, b))
                if ki > 0:  # the block before has left the tensor cores: free its stage
                    mbarrier.arrive(empty.index((it - 1) % NUM_STAGES), count=1)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(order.index(c), count=1)
            mbarrier.arrive(empty.index((base + k_tiles - 1) % NUM_STAGES), count=1)
            tma.store_wait(0)  # this consumer's previous tile has left its C buffer
            c_buf.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma_store(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_buf)
            local += 2
        tma.store_wait(0)

    @gluon.jit
    def gemm_pingpong_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                             BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr):  # fmt: skip
        """A persistent program: one loader warp, two consumer warpgroups taking its tiles in turn."""
        dtype: gl.constexpr = a_desc.dtype
        a_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_K, BLOCK_N], b_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [2, BLOCK_M, BLOCK_N], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(2):
            mbarrier.init(order.index(c), count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)  # a stage belongs to one tile, so to one consumer
        gl.warp_specialize(
            [
                (_consumer, (c_desc, a_smem, b_smem, c_smem, ready, empty, order, M, N, K, 0, BLOCK_M, BLOCK_N, BLOCK_K,
                             GROUP_M, NUM_STAGES)),
                (_consumer, (c_desc, a_smem, b_smem, c_smem, ready, empty, order, M, N, K, 1, BLOCK_M, BLOCK_N, BLOCK_K,
                             GROUP_M, NUM_STAGES)),
                (_loader, (a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                           GROUP_M, NUM_STAGES)),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )  # fmt: skip


def shared_memory_bytes(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, NUM_STAGES: int) -> int:
    """Shared memory of a config (16-bit operands): the ring's A and B tiles and two C buffers, exact, plus 1024
    bytes for the barriers and alignment (compiled for sm_90 they took 168-232)."""
    return 2 * (NUM_STAGES * (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) + 2 * BLOCK_M * BLOCK_N) + 1024


def check_config(precision: str, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, NUM_STAGES: int,
                 CONSUMER_REGS: int) -> str | None:  # fmt: skip
    """Why the kernel cannot run this config (None when it can): precision, tiles, registers, shared memory."""
    if precision not in DTYPES:
        return f"the ping-pong GEMM takes precision {', '.join(DTYPES)}, got {precision!r}"
    for name, value, allowed in (("BLOCK_M", BLOCK_M, BLOCK_MS), ("BLOCK_N", BLOCK_N, BLOCK_NS),
                                 ("BLOCK_K", BLOCK_K, BLOCK_KS)):  # fmt: skip
        if value not in allowed:
            return f"{name} must be one of {allowed} for the ping-pong GEMM, got {value}"
    if NUM_STAGES < 2:
        return f"NUM_STAGES must be >= 2, got {NUM_STAGES}"
    if CONSUMER_REGS % 8 or not 24 <= CONSUMER_REGS <= 240:
        return f"CONSUMER_REGS must be a multiple of 8 in [24, 240], got {CONSUMER_REGS}"
    if BLOCK_M * BLOCK_N // 128 > CONSUMER_REGS - 48:  # the fp32 accumulator, a thread's share, and working room
        return f"a {BLOCK_M}x{BLOCK_N} fp32 accumulator needs more than {CONSUMER_REGS} registers a thread"
    shared = shared_memory_bytes(BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
    if shared > SMEM_BYTES:
        return f"shared memory {shared} B ({NUM_STAGES} stages and two C buffers) exceeds the {SMEM_BYTES} B of an SM"
    return None


def _descriptors(a: Any, b: Any, c: Any, m: int, n: int, k: int, tile: dict[str, int]) -> tuple[Any, Any, Any]:
    dtype = gl.bfloat16 if a.dtype == torch.bfloat16 else gl.float16
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    return (
        TensorDescriptor(a, [m, k], [k, 1], [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], dtype)),
        TensorDescriptor(b, [k, n], [n, 1], [bk, bn], gl.NVMMASharedLayout.get_default_for([bk, bn], dtype)),
        TensorDescriptor(c, [m, n], [n, 1], [bm, bn], gl.NVMMASharedLayout.get_default_for([bm, bn], dtype)),
    )


#: The kernel's knobs (keyword arguments of :func:`matmul_pingpong`) and their defaults.
KNOBS: dict[str, int] = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "NUM_STAGES": 4,
                         "CONSUMER_REGS": 240}  # fmt: skip


def _meta(precision: str, knobs: dict[str, Any]) -> dict[str, Any]:
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown knobs of the ping-pong GEMM: {sorted(unknown)}")
    merged = {**KNOBS, **{name: int(value) for name, value in knobs.items()}}
    reason = check_config(precision, *(merged[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_STAGES",
                                                           "CONSUMER_REGS")))  # fmt: skip
    if reason:
        raise ValueError(reason)
    return {**merged, "num_warps": 4, "maxnreg": MAXNREG}


def _grid(m: int, n: int, meta: dict[str, Any], num_sms: int) -> tuple[int]:
    return (max(1, min(num_sms, triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]))),)


#: :func:`matmul_pingpong`'s launch plans.
_PLANS = PlanCache()


def matmul_pingpong(
    a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None, num_sms: int | None = None, **knobs: Any
) -> torch.Tensor:
    """``A @ B`` with the ping-pong kernel: ``a`` (M, K) and ``b`` (K, N) row-major, both bf16 or both fp16;
    ``out`` (M, N) contiguous, same dtype. ``knobs``: those of :data:`KNOBS`. ``num_sms`` programs at most
    (default: the device's multiprocessor count). Launches asynchronously on the current stream."""
    key = (layout_key(a, b, out), a.device, num_sms, tuple(knobs.items()))
    plan = _PLANS.get(key)
    if plan is None:
        if not available():
            raise ValueError("the ping-pong GEMM needs Gluon (Triton >= 3.6) on an sm_90 GPU")
        precision = next((name for name, dtype in DTYPES.items() if dtype == a.dtype), None)
        if precision is None or b.dtype != a.dtype:
            raise ValueError(f"A and B must both be bf16 or fp16, got {a.dtype} and {b.dtype}")
        m, k = a.shape
        k2, n = b.shape
        if k2 != k or a.stride() != (k, 1) or b.stride() != (n, 1):
            raise ValueError(f"need row-major A (M, K) and B (K, N), got {tuple(a.shape)} {a.stride()} and "
                             f"{tuple(b.shape)} {b.stride()}")  # fmt: skip
        if (k * 2) % 16 or (n * 2) % 16:
            raise ValueError(f"TMA needs 16-byte aligned rows: K={k} and N={n} must be multiples of 8")
        if out is None:
            out = torch.empty((m, n), device=a.device, dtype=a.dtype)
        elif out.shape != (m, n) or out.dtype != a.dtype or not out.is_contiguous():
            raise ValueError(f"out must be contiguous ({m}, {n}) {a.dtype}, got {tuple(out.shape)} {out.dtype}")
        meta = _meta(precision, knobs)
        grid = _grid(m, n, meta, sm_count(a.device) if num_sms is None else num_sms)
        plan = _PLANS.put(key, Plan(gemm_pingpong_kernel, grid, meta, ints=(m, n, k), descs=Descriptors(),
                                    tile=(m, n, k, meta)))  # fmt: skip
    elif out is None:
        out = torch.empty(plan.state["ints"][:2], device=a.device, dtype=a.dtype)
    state = plan.state
    descs = state["descs"].get((a.data_ptr(), b.data_ptr(), out.data_ptr()), _descriptors, a, b, out, *state["tile"])
    plan.launch(*descs, *state["ints"])
    return out


def _mock_args(m: int, n: int, k: int, precision: str, meta: dict[str, Any]) -> tuple[Any, ...]:
    from kernels.attention.attention import mock_tensor_class

    MockTensor = mock_tensor_class()
    dtype = DTYPES[precision]
    a, b, c = MockTensor(dtype, [m, k]), MockTensor(dtype, [k, n]), MockTensor(dtype, [m, n])
    return (*_descriptors(a, b, c, m, n, k, meta), m, n, k)


def compile_only(m: int, n: int, k: int, *, precision: str, **knobs: Any) -> Any | None:
    """Compile the kernel :func:`matmul_pingpong` launches for the current GPU, without launching it (None when
    Gluon is missing or the kernels are interpreted)."""
    if not available():
        return None
    meta = _meta(precision, knobs)
    num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return gemm_pingpong_kernel.warmup(*_mock_args(m, n, k, precision, meta), **meta, grid=_grid(m, n, meta, num_sms))


def compile_for_target(m: int, n: int, k: int, *, precision: str, capability: int = 90, **knobs: Any) -> Any:
    """``triton.compile`` for ``GPUTarget("cuda", capability, 32)`` with no GPU (shared memory, registers)."""
    from kernels.attention.attention import compile_jit_for_target

    meta = _meta(precision, knobs)
    return compile_jit_for_target(gemm_pingpong_kernel, _mock_args(m, n, k, precision, meta), meta, capability)
