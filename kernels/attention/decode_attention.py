"""Attention of one decoded token over a KV cache, split over the cache (flash-decoding), in Triton.

A decode step attends one query a sequence and head over the cache's positions ``0..pos``. SDPA (cuDNN) runs it
as a prefill kernel with one query row in a 16-row tile: one program per (batch, head), 16 programs at batch 1 on
132 SMs, so the step's 18 layers spend 6.8 + 1.8 us each (its kernel and a reduction) reading 4.7 MB at batch 1
(``bench/results/int4-roofline-decode-profile-h200.json``). Here:

- **Split over the cache**: program (b*h, s) attends positions ``[s * CHUNK, (s + 1) * CHUNK)`` up to ``pos``,
  ``BLOCK_N`` rows at a time, the next block's rows read while one computes (scores as a row-wise dot product on
  the CUDA cores: one query row leaves a tensor core nothing to do), each row slot with a running max, sum and
  output of its own, so a step reduces nothing across warps; the slots are combined once at the end into the
  program's partial (base-2 max, sum, unnormalized output). ``SPLITS`` is chosen so that about two programs per
  SM run; positions past ``pos`` are never read (SDPA reads the whole cache and masks it).
- **Combine**: a second kernel, one program per (batch, head), rescales the partials to their common max and
  normalizes. With one split (large batches) the first kernel normalizes and stores the output itself.
- **The cache write, fused**: the program whose chunk holds ``pos`` stores the step's new key and value there
  (quantized for an fp8 cache) and uses them from registers for that row, so no other kernel writes the cache.
- **fp8 caches** (``float8_e4m3fn`` with one scale per layer and tensor) are read as fp8 and scaled in registers:
  half the bytes of bf16, where the SDPA path dequantizes the layer's whole cache to bf16 first.
- **Split-K partials of the qkv product** (a packed int4/int8 ``PARTIALS`` tile, ``qkv`` ``[P, B, 1, 3 * H * D]``):
  each program sums its head's P partial q, k and v rows in fp32 as it loads them, rounded to the output's dtype
  as the summed product would be, so no kernel of its own sums the projection between the two.

Everything runs under CUDA graphs: ``pos`` is read on the device, the grid and ``CHUNK`` depend only on shapes.
:func:`decode_attention` is a ``torch.library`` operator that mutates the cache, so ``torch.compile`` calls it as it
is. Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors (element-wise ops and reductions, no ``tl.dot``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.runtime import interpreter_active

#: e4m3's largest finite value: an fp8 cache stores ``clamp(x / scale, -448, 448)``.
FP8_MAX = 448.0
#: Cache rows a program reads per step by default (32 rows of 128 bf16 = 8 KiB a tensor); the operator's
#: ``block_n`` (16, 32, 64 or 128) sets it.
BLOCK_N = 32
BLOCK_NS = (16, 32, 64, 128)
#: Programs per SM the split aims for.
PROGRAMS_PER_SM = 2
#: The running max's start: finite, so a chunk with no valid position gives alpha = 1 and p = 0, never NaN.
START_MAX = tl.constexpr(-1.0e30)

_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the interpreter: a few splits, so the combine is exercised
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def split_plan(batch_heads: int, max_len: int, sms: int, block_n: int = BLOCK_N) -> tuple[int, int]:
    """``(SPLITS, CHUNK)``: the cache's ``max_len`` positions cut into ``SPLITS`` chunks of ``CHUNK`` (a multiple
    of ``block_n``) so that ``batch_heads * SPLITS`` is about ``PROGRAMS_PER_SM * sms`` programs."""
    blocks = triton.cdiv(max_len, block_n)
    splits = max(1, min(blocks, triton.cdiv(PROGRAMS_PER_SM * sms, batch_heads)))
    chunk = triton.cdiv(blocks, splits) * block_n
    return triton.cdiv(max_len, chunk), chunk


@triton.jit
def _decode_split_kernel(QKV, K_CACHE, V_CACHE, K_SCALE, V_SCALE, POS, OUT, PART_ACC, PART_ML, H, MAX_LEN, CHUNK,
                         qk_scale, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                         FP8: tl.constexpr, PDL: tl.constexpr = False, PARTS: tl.constexpr = 0,
                         PART_STRIDE=0):  # fmt: skip
    """Program (b * H + h, s): positions ``[s * CHUNK, min((s + 1) * CHUNK, pos + 1))`` of head h's cache;
    ``QKV`` is the qkv projection ``[B, 1, 3 * H * D]`` (q, then k, then v, each head's D contiguous), or with
    ``PARTS`` > 0 its ``PARTS`` split-K partial products ``PART_STRIDE`` elements apart, summed here in fp32 and
    rounded to ``OUT``'s dtype (the projection's own rounding).

    ``PDL`` (a programmatic dependent of the kernel before, the qkv projection): the chunk's first ``BLOCK_N``
    cache rows are read before waiting for that kernel, since no kernel of this step writes them (the row at
    ``pos``, the only one this step writes, is taken from registers), and the kernel after may launch at once."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, D)
    cache = bh.to(tl.int64) * MAX_LEN * D
    lo = split * CHUNK
    first = lo + tl.arange(0, BLOCK_N)
    offs = cache + first[:, None] * D + offs_d[None, :]
    k_ptrs = K_CACHE + offs  # advanced a block at a time: no per-step address arithmetic
    v_ptrs = V_CACHE + offs
    if PDL:
        gdc_launch_dependents()
        k_next = tl.load(k_ptrs, mask=(first < MAX_LEN)[:, None], other=0.0)
        v_next = tl.load(v_ptrs, mask=(first < MAX_LEN)[:, None], other=0.0)
        gdc_wait()
    pos = tl.load(POS).to(tl.int32)  # int32 row arithmetic (max_len < 2^31)
    row = QKV + b * 3 * H * D + h * D
    if PARTS:
        q = tl.zeros((D,), tl.float32)
        k_new = tl.zeros((D,), tl.float32)
        v_new = tl.zeros((D,), tl.float32)
        for part in tl.static_range(PARTS):
            q += tl.load(row + part * PART_STRIDE + offs_d).to(tl.float32)
            k_new += tl.load(row + part * PART_STRIDE + H * D + offs_d).to(tl.float32)
            v_new += tl.load(row + part * PART_STRIDE + 2 * H * D + offs_d).to(tl.float32)
        q = q.to(OUT.dtype.element_ty).to(tl.float32) * qk_scale
        k_new = k_new.to(OUT.dtype.element_ty).to(tl.float32)
        v_new = v_new.to(OUT.dtype.element_ty).to(tl.float32)
    else:
        q = tl.load(row + offs_d).to(tl.float32) * qk_scale  # base-2 scores: sm_scale * log2(e) folded into q
        k_new = tl.load(row + H * D + offs_d).to(tl.float32)
        v_new = tl.load(row + 2 * H * D + offs_d).to(tl.float32)
    if FP8:
        k_scale = tl.load(K_SCALE)
        v_scale = tl.load(V_SCALE)
        k_stored = tl.clamp(k_new / k_scale, -448.0, 448.0).to(K_CACHE.dtype.element_ty)
        v_stored = tl.clamp(v_new / v_scale, -448.0, 448.0).to(V_CACHE.dtype.element_ty)
        k_new = k_stored.to(tl.float32) * k_scale  # what the cache holds, as later steps will read it
        v_new = v_stored.to(tl.float32) * v_scale
    else:
        k_stored = k_new.to(K_CACHE.dtype.element_ty)
        v_stored = v_new.to(V_CACHE.dtype.element_ty)
        k_new = k_stored.to(tl.float32)
        v_new = v_stored.to(tl.float32)
    # The cache's rows before pos; the row at pos is this step's k and v, taken from registers after the loop by
    # the program whose chunk holds it (which also stores them there): no other program reads that row.
    hi = tl.minimum(lo + CHUNK, pos)
    owns = (lo <= pos) & (pos < lo + CHUNK)
    q_raw = q * k_scale if FP8 else q  # an fp8 cache's raw values: K's scale folded into q, V's applied at the end
    if not PDL:
        k_next = tl.load(k_ptrs, mask=(first < hi)[:, None], other=0.0)
        v_next = tl.load(v_ptrs, mask=(first < hi)[:, None], other=0.0)
    if owns:  # this chunk holds pos: the step's key and value go in here
        tl.store(K_CACHE + cache + pos * D + offs_d, k_stored)
        tl.store(V_CACHE + cache + pos * D + offs_d, v_stored)
    # Each of the BLOCK_N row slots runs its own online softmax over the positions it sees (start + slot), so a
    # step has no reduction across rows (across warps: shared memory and a barrier); they are combined once, below.
    m_r = tl.full((BLOCK_N,), START_MAX, tl.float32)
    l_r = tl.zeros((BLOCK_N,), tl.float32)
    acc_r = tl.zeros((BLOCK_N, D), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        valid = rows < hi
        k = k_next.to(tl.float32)
        v = v_next.to(tl.float32)
        # the next block's rows, read while this one computes (none past hi: masked, no traffic)
        k_ptrs += BLOCK_N * D
        v_ptrs += BLOCK_N * D
        ahead = (rows + BLOCK_N < hi)[:, None]
        k_next = tl.load(k_ptrs, mask=ahead, other=0.0)
        v_next = tl.load(v_ptrs, mask=ahead, other=0.0)
        s = tl.where(valid, tl.sum(k * q_raw[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_r, s)
        alpha = tl.exp2(m_r - m_new)
        p = tl.exp2(s - m_new)
        acc_r = acc_r * alpha[:, None] + p[:, None] * v
        l_r = l_r * alpha + p
        m_r = m_new
    m_i = tl.max(m_r, 0)
    weight = tl.exp2(m_r - m_i)
    l_i = tl.sum(l_r * weight, 0)
    acc = tl.sum(acc_r * weight[:, None], 0)
    if FP8:
        acc = acc * v_scale
    if owns:  # the step's own key and value, one more position
        s_new = tl.sum(k_new * q, 0)
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp2(m_i - m_new)
        p_new = tl.exp2(s_new - m_new)
        acc = acc * alpha + p_new * v_new
        l_i = l_i * alpha + p_new
        m_i = m_new
    if SPLITS == 1:  # the only split: normalize and store ``out[b, 0, h, :]``
        tl.store(OUT + bh * D + offs_d, (acc / l_i).to(OUT.dtype.element_ty))
    else:
        part = bh * SPLITS + split
        tl.store(PART_ACC + part * D + offs_d, acc)
        tl.store(PART_ML + part * 2, m_i)
        tl.store(PART_ML + part * 2 + 1, l_i)


@triton.jit
def _decode_combine_kernel(OUT, PART_ACC, PART_ML, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                           PDL: tl.constexpr = False):  # fmt: skip
    """Program b * H + h: the splits' partials rescaled to their common max, summed and normalized (splits past
    ``pos`` hold max START_MAX and sum 0, so they weigh nothing). ``BLOCK_S``: SPLITS to a power of two.
    ``PDL``: launched as soon as the split kernel lets it, it waits for the partials."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    bh = tl.program_id(0)
    split = tl.arange(0, BLOCK_S)
    used = split < SPLITS
    parts = bh * SPLITS + split
    offs_d = tl.arange(0, D)
    m = tl.load(PART_ML + parts * 2, mask=used, other=START_MAX)
    weight = tl.exp2(m - tl.max(m, 0))
    total = tl.sum(tl.load(PART_ML + parts * 2 + 1, mask=used, other=0.0) * weight, 0)
    acc = tl.load(PART_ACC + parts[:, None] * D + offs_d[None, :], mask=used[:, None], other=0.0)
    acc = tl.sum(acc * weight[:, None], 0)
    tl.store(OUT + bh * D + offs_d, (acc / total).to(OUT.dtype.element_ty))


def check_operands(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int) -> str | None:
    """Why :func:`decode_attention` cannot take these tensors (None when it can)."""
    if qkv.ndim not in (3, 4) or qkv.shape[-2] != 1 or not qkv.is_contiguous():
        return (
            f"qkv must be a contiguous [B, 1, 3 * H * D] tensor or [P, B, 1, 3 * H * D] partials, got "
            f"{tuple(qkv.shape)} strides {qkv.stride()}"
        )
    if qkv.ndim == 4:
        qkv = qkv[0]
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return f"the caches must be contiguous [B, H, max_len, D] of one shape, got {tuple(k_cache.shape)}, " \
               f"{tuple(v_cache.shape)}"  # fmt: skip
    batch, h, _, d = k_cache.shape
    if h != heads or qkv.shape[0] != batch or qkv.shape[2] != 3 * heads * d:
        return f"qkv {tuple(qkv.shape)} does not match the cache {tuple(k_cache.shape)} with {heads} heads"
    if d & (d - 1) or not 16 <= d <= 256:
        return f"head_dim must be a power of two in [16, 256], got {d}"
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (torch.bfloat16, torch.float16, torch.float32,
                                                                 torch.float8_e4m3fn):  # fmt: skip
        return f"the caches must be bf16, fp16, fp32 or float8_e4m3fn, got {k_cache.dtype} / {v_cache.dtype}"
    return None


def _pdl_options(pdl: bool) -> dict[str, bool]:
    """Both kernels' ``PDL`` constexpr and Triton's ``launch_pdl`` option: launched as programmatic dependents."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


def _launch(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
            v_scale: torch.Tensor, index: torch.Tensor, block_n: int, num_warps: int,
            pdl: bool, out_dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    batch, heads, max_len, d = k_cache.shape
    splits, chunk = split_plan(batch * heads, max_len, _sm_count(qkv.device), block_n)
    out = torch.empty((batch, 1, heads, d), device=qkv.device, dtype=out_dtype)
    parts = {"PARTS": qkv.shape[0], "PART_STRIDE": qkv.stride(0)} if qkv.ndim == 4 else {}
    part_acc = torch.empty((batch * heads * splits, d), device=qkv.device, dtype=torch.float32)
    part_ml = torch.empty((batch * heads * splits, 2), device=qkv.device, dtype=torch.float32)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    qk_scale = 1.0 / math.sqrt(d) * 1.4426950408889634  # log2(e)
    launch = _pdl_options(pdl and not interpreter_active())  # the interpreter has no programmatic launches
    _decode_split_kernel[(batch * heads, splits)](
        qkv, k_cache, v_cache, k_scale, v_scale, index, out, part_acc, part_ml, heads, max_len, chunk, qk_scale,
        D=d, BLOCK_N=block_n, SPLITS=splits, FP8=fp8, num_warps=num_warps, **parts, **launch,
    )  # fmt: skip
    if splits > 1:
        _decode_combine_kernel[(batch * heads,)](out, part_acc, part_ml, D=d, SPLITS=splits,
                                                 BLOCK_S=triton.next_power_of_2(splits), num_warps=num_warps,
                                                 **launch)  # fmt: skip
    return out


@torch.library.custom_op("tuner::decode_attention", mutates_args=("k_cache", "v_cache"))
def decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                     v_scale: torch.Tensor, index: torch.Tensor, heads: int, block_n: int = BLOCK_N,
                     num_warps: int = 4, pdl: bool = False,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    """One decode step's attention for every sequence and head: stores the step's key and value (from ``qkv``,
    the ``[B, 1, 3 * H * D]`` projection) at position ``index`` (a 1-element int64 device tensor) of ``k_cache``
    and ``v_cache`` (``[B, H, max_len, D]``; fp8 ones hold ``x / scale`` with the 0-dim fp32 ``k_scale`` /
    ``v_scale``) and returns softmax(q K^T / sqrt(D)) V over positions ``0..index`` as ``[B, 1, H, D]`` in
    ``out_dtype`` (default: qkv's dtype). ``qkv`` may also be the projection's split-K partial products
    ``[P, B, 1, 3 * H * D]`` (fp32 or 16-bit), summed here. ``block_n``: cache rows a program reads per step (one
    of :data:`BLOCK_NS`); ``num_warps`` 1-8; ``pdl``: both kernels launched as programmatic dependents (Hopper),
    the split kernel reading its first cache rows before it waits for the kernel before."""
    reason = check_operands(qkv, k_cache, v_cache, heads)
    if block_n not in BLOCK_NS:
        reason = f"block_n must be one of {BLOCK_NS}, got {block_n!r}"
    if num_warps not in (1, 2, 4, 8):
        reason = f"num_warps must be 1, 2, 4 or 8, got {num_warps!r}"
    if reason:
        raise ValueError(reason)
    return _launch(qkv, k_cache, v_cache, k_scale, v_scale, index, block_n, num_warps, pdl, out_dtype or qkv.dtype)


@decode_attention.register_fake
def _decode_attention_shape(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                            v_scale: torch.Tensor, index: torch.Tensor, heads: int, block_n: int = BLOCK_N,
                            num_warps: int = 4, pdl: bool = False,
                            out_dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    batch, _, _, d = k_cache.shape
    return qkv.new_empty((batch, 1, heads, d), dtype=out_dtype or qkv.dtype)


def compile_for_target(batch: int, heads: int, max_len: int, head_dim: int, *, cache_dtype: torch.dtype,
                       dtype: torch.dtype = torch.bfloat16, sms: int = 132, block_n: int = BLOCK_N,
                       num_warps: int = 4, pdl: bool = False, parts: int = 0, parts_dtype: torch.dtype | None = None,
                       capability: int = 90) -> list:  # fmt: skip
    """``triton.compile`` of the kernels :func:`decode_attention` launches for these shapes (the split kernel, and
    the combine when there is more than one split) for ``GPUTarget("cuda", capability, 32)``, no GPU needed.
    ``parts``: qkv given as that many split-K partials of ``parts_dtype`` (default fp32)."""
    from kernels.attention.attention import compile_jit_for_target, mock_tensor_class

    MockTensor = mock_tensor_class()
    splits, chunk = split_plan(batch * heads, max_len, sms, block_n)
    if parts:
        qkv = MockTensor(parts_dtype or torch.float32, [parts, batch, 1, 3 * heads * head_dim])
    else:
        qkv = MockTensor(dtype, [batch, 1, 3 * heads * head_dim])
    caches = [MockTensor(cache_dtype, [batch, heads, max_len, head_dim]) for _ in range(2)]
    scales = [MockTensor(torch.float32, []) for _ in range(2)]
    out = MockTensor(dtype, [batch, 1, heads, head_dim])
    part_acc = MockTensor(torch.float32, [batch * heads * splits, head_dim])
    part_ml = MockTensor(torch.float32, [batch * heads * splits, 2])
    index = MockTensor(torch.int64, [1])
    args = (qkv, *caches, *scales, index, out, part_acc, part_ml, heads, max_len, chunk, 0.18)
    launch = _pdl_options(pdl)
    meta = {"D": head_dim, "BLOCK_N": block_n, "SPLITS": splits, "FP8": cache_dtype == torch.float8_e4m3fn,
            "num_warps": num_warps, **launch}  # fmt: skip
    if parts:
        meta |= {"PARTS": parts, "PART_STRIDE": batch * 3 * heads * head_dim}
    kernels = [compile_jit_for_target(_decode_split_kernel, args, meta, capability)]
    if splits > 1:
        kernels.append(compile_jit_for_target(
            _decode_combine_kernel, (out, part_acc, part_ml),
            {"D": head_dim, "SPLITS": splits, "BLOCK_S": triton.next_power_of_2(splits), "num_warps": num_warps,
             **launch},
            capability))  # fmt: skip
    return kernels
