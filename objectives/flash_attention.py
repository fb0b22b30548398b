"""The ``flash_attention`` workload: one fused attention forward with the Triton kernel of
``kernels/attention/attention.py``.

Args (the shape, fixed for a study): ``batch``, ``heads``, ``seq_len``,
``head_dim`` (64 or 128), ``causal`` and ``seed``. Knobs: ``kernel`` (the
variant: ``tutorial``, the one-program-per-query-block kernel of
``kernels/attention/attention.py``; ``persistent_tma`` / ``persistent_tma_ws``, the persistent,
causal-balanced TMA kernel of ``kernels/attention/attention_persistent.py`` without / with warp
specialization; ``gluon_ws``, the Gluon kernel of ``kernels/attention/attention_ws.py`` with a TMA loader warp and two
or three
consumer warpgroups (CONSUMERS; three at head_dim 64 only), sm_90 only: BLOCK_M 128 and 4 warps per consumer fixed,
num_stages its K/V stages, OVERLAP its intra-warpgroup overlap, ONE_LOOP its key blocks in one loop, CHAIN a
persistent program's tiles as one overlapped stream, EPILOGUE how its output tile is stored, RELEASE_K a K slot
freed after its scores, HALF_DIAG the first consumer's half of a causal tile's diagonal key block, EXP_POLY how
many of every 8 exponentials a polynomial on the FMA pipe takes, SUM_MMA each row's sum of P by a wgmma, STREAM_KV
the persistent grid's last round dealt out to every SM by key blocks, Q_BUFFERS a consumer's Q tiles in shared
memory, LPT_HEADS the persistent programs' tiles from a longest-first table by groups of that many heads), BLOCK_M,
BLOCK_N, num_warps, num_stages, precision (bf16, fp16), use_tma (the tutorial kernel's Q/K/V tiles through tensor
descriptors, Hopper and newer) and SPLIT_M (the persistent kernel's two query sub-tiles). Metrics: TFLOP/s, latency and
the maximum relative error against ``scaled_dot_product_attention`` in fp32
on the fp32 master inputs, so the error includes input rounding.

torch and triton are imported inside the methods: listing workloads and
``static_check`` stay fast and never touch a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kernels.attention.attention_ws_rules import KNOBS, knob_conflict
from tuner.workloads.base import DeviceInfo, MetricSpec, comment_text, interpreter_active, is_pow2, missing_params
from tuner.workloads.kernel import (
    LATENCY_METRIC,
    TIMING_METRICS,
    Checked,
    KernelWorkload,
    NumericsCheck,
    Reference,
    check_timing,
)
from tuner.workloads.kernel import check_numerics as shared_check_numerics

PRECISIONS: tuple[str, ...] = ("bf16", "fp16")
TILE_PARAMS: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
#: The kernel variants (the ``kernel`` knob; a config without it is ``tutorial``) and the function each configures.
KERNELS: dict[str, str] = {
    "tutorial": "kernels.attention.attention.attention",
    "persistent_tma": "kernels.attention.attention_persistent.attention_persistent",
    "persistent_tma_ws": "kernels.attention.attention_persistent.attention_persistent",
    "gluon_ws": "kernels.attention.attention_ws.attention_ws",
}
PERSISTENT: tuple[str, ...] = ("persistent_tma", "persistent_tma_ws")
#: Programs of the persistent kernel under the interpreter (no SMs to count): several, so tiles are shared.
INTERPRETER_PROGRAMS = 3
HEAD_DIMS: tuple[int, ...] = (64, 128)

#: Largest ``max|out - ref| / max|ref|`` accepted, ref = fp32 SDPA of the fp32 masters (standard
#: normal Q, K, V). An emulation of the kernel's rounding points in torch (Q, K, V and P rounded
#: to the precision, fp32 scores, row sums and accumulator, output rounded) gave, on the
#: benchmark's shapes (S 1024/4096/8192, D 64/128, causal or not, two heads each):
#: bf16 <= 8.1e-3 and fp16 <= 9.1e-4; the kernel under the Triton interpreter gave fp16
#: <= 6.8e-4 (S 33..80, D 64/128). The tolerances leave ~4x headroom for the maximum over more
#: heads and accumulation order, while a wrong mask, scale or rescaling errs by 0.1 or more.
TOLERANCE_VS_FP32: dict[str, float] = {"bf16": 3e-2, "fp16": 5e-3}
#: Compute capability each feature needs on a GPU (bf16 tensor cores: Ampere; TMA: Hopper).
MIN_CAPABILITY: dict[str, tuple[int, int]] = {"bf16": (8, 0), "use_tma": (9, 0)}
#: Registers per thread the fp32 score tile (BLOCK_M x BLOCK_N) and the fp32 output accumulator
#: (BLOCK_M x head_dim) may take together. The hardware allows 255; the rest holds P in 16 bits,
#: the row statistics and addresses. Measured by compiling for sm_90 (Triton 3.9, ptxas 13.x,
#: 160 tiles: BLOCK_M 32..256, BLOCK_N 16..256, 4/8 warps, D 64/128, causal or not, seq_len
#: 4096): at or below 192 a kernel spills at most 92 bytes (most spill nothing; 128x64 tiles at
#: D=128 on 4 warps, the tutorial's config, spill 8-44); every tile above it spills 888 bytes or
#: more in the causal or the full kernel (e.g. 128x128 at D=128 on 4 warps: 256 here, 1532 bytes
#: when causal). See also :data:`MAX_BLOCK_N_WITH_KEY_TAIL`.
ACCUMULATOR_REGISTERS_PER_THREAD = 192
#: Shared memory a TMA kernel takes besides its tiles, in bytes: the tiles of a TMA pipeline are
#: 1024-byte aligned (128-byte swizzle) and its mbarriers (8 bytes each) are allocated with them.
#: Measured on sm_90 (Triton 3.9): 32 to 88 bytes past the tiles, or exactly 1024 when the barriers
#: go first and the tiles are aligned after them (the causal kernel's two loops, some others).
TMA_SHARED_OVERHEAD_BYTES = 1024
#: Widest key block when seq_len is not a multiple of it. The masked last key block (key < seq_len
#: masks on the loads and the scores) is a second copy of the loop body; with BLOCK_N 256 that
#: kernel spilled 150-3200 bytes on sm_90 (seq_len 1000, tiles within the register budget),
#: with BLOCK_N <= 128 at most 324.
MAX_BLOCK_N_WITH_KEY_TAIL = 128


def _next_pow2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def smem_estimate_bytes(
    block_m: int, block_n: int, num_stages: int, head_dim: int, element_bytes: int = 2, use_tma: bool = False
) -> int:
    """Shared memory of one program, in bytes: the Q tile once, K and V tiles per pipeline stage.

    An upper bound of what Triton allocates for sm_90, checked by compiling
    ahead of time (``tests/test_attention_kernel.py``; Triton 3.9): exact for
    pointer loads with ``num_stages >= 2`` and ``BLOCK_M >= 64`` (``wgmma``),
    at most :data:`TMA_SHARED_OVERHEAD_BYTES` above the tiles with TMA, and
    above the truth for ``num_stages == 1`` (one K/V buffer: one tile less)
    and ``BLOCK_M == 32`` (``mma.sync``, fewer buffers in shared memory).
    """
    tiles = (block_m * head_dim + num_stages * 2 * block_n * head_dim) * element_bytes
    return tiles + (TMA_SHARED_OVERHEAD_BYTES if use_tma else 0)


@dataclass
class _Case:
    """Inputs, reference and output buffer of one precision on one device, reused across trials."""

    q: Any
    k: Any
    v: Any
    ref: Any  # fp32 SDPA of the fp32 masters
    out: Any
    device: DeviceInfo = field(default_factory=DeviceInfo)  # where it lives (the persistent kernel's SM count)


def check_numerics(out: Any, ref: Any, precision: str) -> NumericsCheck:
    """Compare the kernel's ``out`` with the fp32 SDPA reference (:func:`tuner.workloads.kernel.check_numerics`;
    the error is relative to ``max|ref|``)."""
    from kernels.gemm.gemm import max_rel_error

    tolerance = TOLERANCE_VS_FP32[precision]
    reference = Reference("max_rel_error", ref, tolerance, "the fp32 SDPA reference", f"{precision} tolerance ")
    return shared_check_numerics(out, [reference], max_rel_error)


class FlashAttention(KernelWorkload):
    """Fused attention forward (online softmax), checked against fp32 SDPA, then timed.

    Args: ``batch``, ``heads``, ``seq_len`` (positive ints), ``head_dim`` (64
    or 128), ``causal`` (bool, default False) and ``seed`` (int, default 0) for
    the fp32 master Q, K, V (standard normal, ``[batch, heads, seq_len, head_dim]``).
    """

    name = "flash_attention"
    shape_args = ("batch", "heads", "seq_len", "head_dim", "causal")
    key_knobs = ("precision",)
    space_file = "attention.yaml"
    metrics = (
        MetricSpec("tflops", "maximize", "TFLOP/s", "4*B*H*S*S*D (half when causal) / median latency"),
        MetricSpec(
            "max_rel_error",
            "minimize",
            "",
            "max|O - O_ref| / max|O_ref|, O_ref = fp32 SDPA of the fp32 master inputs",
        ),
        LATENCY_METRIC,
        *TIMING_METRICS,
    )
    description = (
        "Triton flash attention forward (kernels/attention/attention.py): tiles, warps, stages, TMA, bf16/fp16"
    )

    def __init__(
        self,
        batch: int,
        heads: int,
        seq_len: int,
        head_dim: int,
        causal: bool = False,
        seed: int = 0,
        timing: str = "eager",
    ) -> None:
        for arg, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be a bool, got {causal!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if batch * heads * seq_len * head_dim >= 2**31:
            # TMA coordinates and per-head offsets are 32-bit in the kernel.
            raise ValueError(
                f"batch * heads * seq_len * head_dim must be < 2**31, got {batch}*{heads}*{seq_len}*{head_dim}"
            )
        super().__init__()
        self.timing = check_timing(timing)
        self.batch, self.heads, self.seq_len, self.head_dim = batch, heads, seq_len, head_dim
        self.causal, self.seed = causal, seed
        self._masters: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._cases: dict[tuple[str, str], _Case] = {}

    @property
    def flops(self) -> float:
        """Floating-point operations of one forward: ``4*B*H*S*S*D``, half of it when causal."""
        flops = 4.0 * self.batch * self.heads * self.seq_len * self.seq_len * self.head_dim
        return flops / 2 if self.causal else flops

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, (*TILE_PARAMS, "precision"))
        if reason:
            return reason
        precision = config["precision"]
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        try:
            tile = self._tile(config)
        except (TypeError, ValueError):
            return f"tile parameters must be ints, got {[config[p] for p in TILE_PARAMS]}"
        use_tma = config.get("use_tma", False)
        if not isinstance(use_tma, bool):
            return f"use_tma must be true or false, got {use_tma!r}"
        if config.get("kernel") == "gluon_ws":
            return self._gluon_ws_check(config, tile, device)
        for p in ("BLOCK_M", "BLOCK_N"):
            if not is_pow2(tile[p]) or tile[p] < 16:
                return f"{p}={tile[p]} must be a power of two >= 16 (tl.arange and tl.dot need one)"
        if not is_pow2(tile["num_warps"]) or tile["num_warps"] > 16:
            return f"num_warps={tile['num_warps']} must be a power of two <= 16"
        if tile["num_stages"] < 1:
            return f"num_stages={tile['num_stages']} must be >= 1"
        padded = max(16, _next_pow2(self.seq_len))
        for p in ("BLOCK_M", "BLOCK_N"):
            if tile[p] > padded:
                return f"{p}={tile[p]} exceeds seq_len={self.seq_len} rounded up to a power of two ({padded})"
        accumulators = tile["BLOCK_M"] * (tile["BLOCK_N"] + self.head_dim)
        if accumulators > ACCUMULATOR_REGISTERS_PER_THREAD * 32 * tile["num_warps"]:
            return (
                f"fp32 score and output tiles BLOCK_M*(BLOCK_N+head_dim)={accumulators} exceed "
                f"{ACCUMULATOR_REGISTERS_PER_THREAD} registers per thread on {tile['num_warps']} warps (spills)"
            )
        if self.seq_len % tile["BLOCK_N"] and tile["BLOCK_N"] > MAX_BLOCK_N_WITH_KEY_TAIL:
            return (
                f"BLOCK_N={tile['BLOCK_N']} with seq_len={self.seq_len} not a multiple of it: the masked last key "
                f"block makes the kernel spill registers (at most {MAX_BLOCK_N_WITH_KEY_TAIL} then)"
            )
        kernel = config.get("kernel", "tutorial")
        reason = self._variant_check(config, kernel)
        if reason:
            return reason
        persistent = kernel != "tutorial"
        if device.smem_per_block_bytes is not None:
            smem = smem_estimate_bytes(
                tile["BLOCK_M"], tile["BLOCK_N"], tile["num_stages"], self.head_dim, use_tma=use_tma or persistent
            )
            if smem > device.smem_per_block_bytes:
                tma = " + TMA barriers" if use_tma else ""
                return (
                    f"Q tile + {tile['num_stages']} stages of K and V tiles{tma} need {smem} bytes of shared memory, "
                    f"{device.name} has {device.smem_per_block_bytes} per block"
                )
        if precision == "bf16" and (not device.is_gpu or interpreter_active()):
            # Triton 3.9's interpreter computes bf16 tl.dot wrongly (see kernels/attention/attention.py).
            return "bf16 is not checked under the Triton interpreter (it computes bf16 products wrongly)"
        if device.is_gpu and device.compute_capability is not None:
            for feature, enabled in ((precision, True), ("use_tma", use_tma or persistent)):
                needed = MIN_CAPABILITY.get(feature)
                if enabled and needed is not None and tuple(device.compute_capability) < needed:
                    return (
                        f"{feature} needs compute capability >= {needed[0]}.{needed[1]}, "
                        f"{device.name} has {device.compute_capability[0]}.{device.compute_capability[1]}"
                    )
        return None

    def _gluon_ws_check(self, config: dict[str, Any], tile: dict[str, int], device: DeviceInfo) -> str | None:
        """The Gluon kernel's own rules: its fixed tile, its knobs, and an sm_90 GPU (wgmma, setmaxnreg)."""
        for knob in ("use_tma", "SPLIT_M"):
            if config.get(knob, False):
                return f"{knob} belongs to the Triton kernels; gluon_ws always loads through TMA, 64 rows per consumer"
        for knob in ("OVERLAP", "PERSISTENT", "PINGPONG", "ONE_LOOP", "CHAIN", "RELEASE_K", "HALF_DIAG", "SUM_MMA",
                     "STREAM_KV"):
            if not isinstance(config.get(knob, False), bool):
                return f"{knob} must be true or false, got {config.get(knob)!r}"
        epilogue = config.get("EPILOGUE", 0)
        if epilogue not in (0, 1, 2) or isinstance(epilogue, bool):
            return f"EPILOGUE (how a consumer stores its output tile) must be 0, 1 or 2, got {epilogue!r}"
        consumers = config.get("CONSUMERS", 2)
        if consumers not in (2, 3) or isinstance(consumers, bool):
            return f"CONSUMERS (consumer warpgroups of 64 query rows) must be 2 or 3, got {consumers!r}"
        knobs = {name: config[name] for name in KNOBS if name in config}
        conflict = knob_conflict({**knobs, "BLOCK_N": int(tile["BLOCK_N"])})
        if conflict:
            return conflict
        if tile["BLOCK_M"] != 128 or tile["num_warps"] != 4:
            return (
                "gluon_ws takes BLOCK_M=128 (its query rows are 64 per consumer: CONSUMERS sets them) and "
                f"num_warps=4 (per consumer), got BLOCK_M={tile['BLOCK_M']}, num_warps={tile['num_warps']}"
            )
        if not device.is_gpu or interpreter_active():
            return "gluon_ws is a Gluon kernel for sm_90 GPUs: the Triton interpreter does not run it"
        capability = tuple(device.compute_capability or (0, 0))
        if capability[0] != 9:
            return f"gluon_ws needs compute capability 9.x (wgmma), {device.name} has {capability[0]}.{capability[1]}"
        from kernels.attention.attention_ws import available
        from kernels.attention.attention_ws_rules import check_config

        if not available():
            return "gluon_ws needs Triton's Gluon (triton.experimental.gluon, Triton >= 3.6)"
        return check_config(self.head_dim, tile["BLOCK_N"], tile["num_stages"], config["precision"], consumers,
                            epilogue=epilogue, sum_mma=bool(config.get("SUM_MMA", False)),
                            q_buffers=config.get("Q_BUFFERS", 1))  # fmt: skip

    @staticmethod
    def _variant_check(config: dict[str, Any], kernel: Any) -> str | None:
        """The ``kernel`` knob and the persistent variants' own knobs."""
        if kernel not in KERNELS:
            return f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}"
        split_m = config.get("SPLIT_M", False)
        if not isinstance(split_m, bool):
            return f"SPLIT_M must be true or false, got {split_m!r}"
        if kernel == "tutorial":
            return None
        if config.get("use_tma", False):
            return f"use_tma belongs to the tutorial kernel; {kernel} always loads through TMA"
        if split_m and int(config["BLOCK_M"]) < 32:
            return "SPLIT_M needs BLOCK_M >= 32 (two query sub-tiles of >= 16 rows)"
        return None

    # ------------------------------------------------------------------ compile ahead

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile for the calling thread's current CUDA device without launching (``compile_only``)."""
        from kernels.attention.attention import compile_only

        if config.get("kernel") == "gluon_ws":
            from kernels.attention.attention_ws import compile_only as compile_ws

            compile_ws(self.batch, self.heads, self.seq_len, self.head_dim, causal=self.causal,
                       precision=config["precision"], **self._gluon_ws_kwargs(config))  # fmt: skip
            return
        if config.get("kernel", "tutorial") != "tutorial":
            from kernels.attention.attention_persistent import compile_only as compile_persistent

            compile_persistent(
                self.batch, self.heads, self.seq_len, self.head_dim, causal=self.causal,
                precision=config["precision"], **self._persistent_kwargs(config, device),
            )  # fmt: skip
            return
        compile_only(
            self.batch,
            self.heads,
            self.seq_len,
            self.head_dim,
            causal=self.causal,
            precision=config["precision"],
            use_tma=bool(config.get("use_tma", False)),
            **self._tile(config),
        )

    # ------------------------------------------------------------------ the trial's parts (KernelWorkload.run)

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        return check_numerics(case.out, case.ref, config["precision"]).checked()

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        latency_s = median_ms * 1e-3
        return {"tflops": self.flops / latency_s / 1e12 if latency_s > 0 else math.inf, "latency_ms": median_ms}

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """FLOPs as :attr:`flops`; Q, K, V read once and O written once, 2 bytes per element."""
        moved = 4 * self.batch * self.heads * self.seq_len * self.head_dim * 2
        return self.flops, float(moved), config["precision"]

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as ``triton.Config(kwargs, num_warps=..., num_stages=...)`` takes it, plus precision, TMA,
        the kernel variant and the function it configures (``function``)."""
        tile = self._tile(config)
        kernel = config.get("kernel", "tutorial")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        if kernel == "gluon_ws":
            return {
                "kwargs": self._gluon_ws_kwargs(config),
                "num_warps": tile["num_warps"],
                "num_stages": tile["num_stages"],
                "precision": config["precision"],
                "use_tma": True,
                "kernel": kernel,
                "function": KERNELS[kernel],
            }
        kwargs: dict[str, Any] = {"BLOCK_M": tile["BLOCK_M"], "BLOCK_N": tile["BLOCK_N"]}
        if kernel != "tutorial":
            kwargs.update(SPLIT_M=bool(config.get("SPLIT_M", False)), WARP_SPECIALIZE=kernel == "persistent_tma_ws")
        return {
            "kwargs": kwargs,
            "num_warps": tile["num_warps"],
            "num_stages": tile["num_stages"],
            "precision": config["precision"],
            "use_tma": bool(config.get("use_tma", False)) or kernel != "tutorial",
            "kernel": kernel,
            "function": KERNELS[kernel],
        }

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """The variant's function (:data:`KERNELS`) and its keyword arguments: ``fn(q, k, v, **kwargs)``."""
        kernel = config.get("kernel", "tutorial")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        if kernel == "gluon_ws":
            kwargs = self._gluon_ws_kwargs(config)
        elif kernel in PERSISTENT:
            kwargs = self._persistent_kwargs(config, None)
        else:
            kwargs = {**self._tile(config), "use_tma": bool(config.get("use_tma", False))}
        return {"function": KERNELS[kernel], "kwargs": {"causal": self.causal, **kwargs}}

    def export_python(self, config: dict[str, Any]) -> str:
        """A call of the variant's function (``kernels.attention.attention.attention`` or the persistent one), ready to
        paste."""
        exported = self.export_config(config)
        kwargs = exported["kwargs"]
        causal = "causal" if self.causal else "non-causal"
        module, function = exported["function"].rsplit(".", 1)
        header = (
            f"from {module} import {function}\n\n"
            f"# B={self.batch} H={self.heads} S={self.seq_len} D={self.head_dim} {causal}, "
            f"Q/K/V in {comment_text(exported['precision'])}; kernel variant {comment_text(exported['kernel'])}\n"
        )
        if exported["kernel"] == "gluon_ws":
            lines = "".join(f"    {name}={value!r},\n" for name, value in kwargs.items())
            return (
                f"{header}# an sm_90 GPU; two consumer warpgroups of 64 query rows and a TMA loader warp per program\n"
                f"ATTENTION_CONFIG = dict(\n{lines})\n"
                f"# out = {function}(q, k, v, causal={self.causal!r}, **ATTENTION_CONFIG)\n"
            )
        if exported["kernel"] == "tutorial":
            extra = f"    use_tma={exported['use_tma']!r},\n"
        else:
            extra = f"    split_m={kwargs['SPLIT_M']!r},\n    warp_specialize={kwargs['WARP_SPECIALIZE']!r},\n"
        call = "" if exported["kernel"] == "tutorial" else "num_sms=<the GPU's SM count>, "
        return (
            f"{header}"
            "ATTENTION_CONFIG = dict(\n"
            f"    BLOCK_M={kwargs['BLOCK_M']!r},\n"
            f"    BLOCK_N={kwargs['BLOCK_N']!r},\n"
            f"    num_warps={exported['num_warps']!r},\n"
            f"    num_stages={exported['num_stages']!r},\n"
            f"{extra}"
            ")\n"
            f"# out = {function}(q, k, v, causal={self.causal!r}, {call}**ATTENTION_CONFIG)\n"
        )

    # ------------------------------------------------------------------ helpers

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """One launch of the config's kernel, writing ``case.out``: the only way ``run`` calls the kernel."""
        from kernels.attention.attention import attention

        if config.get("kernel") == "gluon_ws":
            from kernels.attention.attention_ws import attention_ws

            attention_ws(case.q, case.k, case.v, causal=self.causal, out=case.out, **self._gluon_ws_kwargs(config))
            return
        if config.get("kernel", "tutorial") != "tutorial":
            from kernels.attention.attention_persistent import attention_persistent

            attention_persistent(
                case.q, case.k, case.v, causal=self.causal, out=case.out,
                **self._persistent_kwargs(config, case.device),
            )  # fmt: skip
            return
        attention(
            case.q,
            case.k,
            case.v,
            causal=self.causal,
            use_tma=bool(config.get("use_tma", False)),
            out=case.out,
            **self._tile(config),
        )

    @staticmethod
    def _tile(config: dict[str, Any]) -> dict[str, int]:
        return {p: int(config[p]) for p in TILE_PARAMS}

    @staticmethod
    def _gluon_ws_kwargs(config: dict[str, Any]) -> dict[str, Any]:
        """The Gluon kernel's arguments: its key block, K/V stages (``num_stages``), overlap, persistent and
        ping-pong flags, consumer warpgroups, one loop over a tile's key blocks, tiles chained."""
        return {
            "BLOCK_N": int(config["BLOCK_N"]),
            "NUM_BUFFERS": int(config["num_stages"]),
            "OVERLAP": bool(config.get("OVERLAP", False)),
            "PERSISTENT": bool(config.get("PERSISTENT", False)),
            "PINGPONG": bool(config.get("PINGPONG", False)),
            "CONSUMERS": int(config.get("CONSUMERS", 2)),
            "ONE_LOOP": bool(config.get("ONE_LOOP", False)),
            "CHAIN": bool(config.get("CHAIN", False)),
            "EPILOGUE": int(config.get("EPILOGUE", 0)),
            "RELEASE_K": bool(config.get("RELEASE_K", False)),
            "HALF_DIAG": bool(config.get("HALF_DIAG", False)),
            "EXP_POLY": int(config.get("EXP_POLY", 0)),
            "SUM_MMA": bool(config.get("SUM_MMA", False)),
            "STREAM_KV": bool(config.get("STREAM_KV", False)),
            "Q_BUFFERS": int(config.get("Q_BUFFERS", 1)),
            "LPT_HEADS": int(config.get("LPT_HEADS", 0)),
        }

    @classmethod
    def _persistent_kwargs(cls, config: dict[str, Any], device: DeviceInfo | None) -> dict[str, Any]:
        """The tile plus the persistent kernel's arguments: one program per SM (with no ``device``, the
        kernel's default: the tensors' device's), its two flags."""
        kwargs = {
            **cls._tile(config),
            "split_m": bool(config.get("SPLIT_M", False)),
            "warp_specialize": config.get("kernel") == "persistent_tma_ws",
        }
        if device is not None:
            kwargs["num_sms"] = device.sm_count if device.is_gpu and device.sm_count else INTERPRETER_PROGRAMS
        return kwargs

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """Inputs, reference and output buffer for the config's precision, built on first use."""
        precision = config["precision"]
        torch_device = "cuda" if device.is_gpu else "cpu"
        key = (precision, torch_device)
        case = self._cases.get(key)
        if case is not None:
            return case
        import torch

        from kernels.attention.attention import make_masters, quantize, reference_attention

        masters = self._masters.get(torch_device)
        if masters is None:
            q, k, v = make_masters(self.batch, self.heads, self.seq_len, self.head_dim, torch_device, self.seed)
            masters = (q, k, v, reference_attention(q, k, v, self.causal))
            self._masters[torch_device] = masters
        q, k, v, ref = masters
        q16, k16, v16 = quantize((q, k, v), precision)
        case = _Case(q16, k16, v16, ref, torch.empty_like(q16), device=device)
        self._cases[key] = case
        return case
