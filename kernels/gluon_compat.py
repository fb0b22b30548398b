"""Names that Gluon's Hopper API changed between Triton 3.6 (the oldest the project supports) and later releases,
bound once for the Gluon kernel families (:mod:`kernels.gemm.gemm_ws`, :mod:`kernels.quant.quant_gemm_ws` and the
:mod:`kernels.attention.attention_ws` modules). Empty where Gluon is missing."""

from __future__ import annotations

try:  # Gluon (Triton >= 3.6)
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma

    #: TMA copy global -> shared (Triton 3.6: async_copy_global_to_shared, later async_load).
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    #: TMA copy shared -> global (Triton 3.6: async_copy_shared_to_global, later async_store).
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
    #: Barrier of the warps of a partition, or of the CTA outside warp specialization (Triton 3.6: thread_barrier,
    #: later barrier).
    warps_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
except ImportError:  # pragma: no cover - older Triton
    pass
