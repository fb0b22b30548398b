"""A small GPT (decoder-only transformer) shared by the whole-step workloads ``train_step`` and ``decode_step``.

Architecture (chosen to be plain and fast, and documented here once):

- token embedding plus a learned absolute position embedding (``seq_len`` positions);
- ``n_layers`` pre-norm blocks: ``x + attn(rmsnorm(x))`` then ``x + mlp(rmsnorm(x))``, with
  RMSNorm (eps 1e-5, learned scale), causal multi-head self-attention with one fused ``qkv``
  Linear (``d_model -> 3*d_model``) and an output Linear, and a GELU (tanh approximation) MLP
  ``d_model -> d_ff -> d_model``. No Linear has a bias, no dropout;
- a final RMSNorm and an LM head **tied** to the token embedding (``logits = x @ E^T``), as
  GPT-2: it saves ``vocab_size * d_model`` parameters and their optimizer state. A quantized decoder may run
  the head as a weight-only quantized copy of E (``lm_head``, :func:`models.quant_linear.quantize_head`).

Every Linear of the blocks is built by ``linear_factory(in_features, out_features, bias)``
(default :class:`torch.nn.Linear`), so a workload can swap them: :class:`Fp8Linear` (fp8
forward through ``torch._scaled_mm``) for training, weight-only quantized Linears for decoding
(:func:`replace_linears` converts the Linears of an initialized model instead).

Attention implementations (``attention=``): ``"sdpa"`` (:func:`torch.nn.functional.scaled_dot_product_attention`
with ``is_causal=True``; the caller picks the backend with ``torch.nn.attention.sdpa_kernel``),
``"math"`` (explicit ``softmax(QK^T/sqrt(D)) V`` in the activations' dtype, softmax in fp32) and
``"triton"`` (the project's flash kernel, :func:`kernels.attention.attention.attention`, bf16/fp16 only;
where a gradient is needed, through :func:`kernels.attention.attention_grad.flash_attention` and its
backward kernels) and ``"flash_decode"`` (SDPA as ``"sdpa"``, except that a decode step's attention over the cache
is :func:`kernels.attention.decode_attention.decode_attention`, split over the cache, which also writes the step's key
and
value into it).

KV-cache decoding: :meth:`GPT.init_cache` allocates a :class:`KVCache` (per layer ``k`` and ``v``
of ``[B, H, max_len, D]`` in bf16/fp16/fp32 or ``float8_e4m3fn`` with a per-layer scale),
:meth:`GPT.prefill` runs a prompt and fills positions ``0..P-1``, :meth:`GPT.decode` runs one
token at position ``pos``, appends its k/v and attends over positions ``0..pos``. ``decode`` is
CUDA-graph capturable when ``pos`` is a 0-dim device tensor: it writes the cache with
``index_copy_`` at a device index and attends over the whole ``max_len`` with a mask built from
``pos`` on the device (static shapes, no host synchronization).

:class:`GPTConfig`, :data:`PRESETS`, :func:`model_flops_per_token` and :func:`resolve_config` live in
the torch-free :mod:`models.config` (so workloads validate shapes without importing torch) and are
re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from models.config import PRESETS, GPTConfig, model_flops_per_token, resolve_config

__all__ = [
    "ATTENTION_MODES",
    "FP8_E4M3_MAX",
    "GPT",
    "PRESETS",
    "Fp8Linear",
    "GPTConfig",
    "KVCache",
    "fp8_quantize",
    "init_weights",
    "lm_loss",
    "make_model",
    "model_flops_per_token",
    "pretrain",
    "replace_linears",
    "resolve_config",
    "synthetic_batch",
]

#: Attention implementations ``GPT(attention=...)`` accepts.
ATTENTION_MODES: tuple[str, ...] = ("sdpa", "math", "triton", "flash_decode")
#: Tile config of the Triton flash kernel in ``attention="triton"`` (valid for head_dim 16..128 on sm_80+).
TRITON_ATTENTION_CONFIG: dict[str, int] = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
#: Largest finite float8_e4m3fn value: per-tensor scales map a tensor's max |x| onto it.
FP8_E4M3_MAX = 448.0
#: Standard deviation of the normal initialization of every matrix (GPT-2's 0.02).
INIT_STD = 0.02


# ---------------------------------------------------------------------------------------- fp8 linear


def fp8_quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor ``float8_e4m3fn`` quantization: ``(q, scale)`` with ``t ~= q.float() * scale``.

    ``scale = max|t| / 448`` (fp32, 0-dim, on ``t``'s device; at least 1e-12 so an all-zero tensor
    works); computed on the device, no host synchronization.
    """
    scale = (t.detach().abs().amax().float() / FP8_E4M3_MAX).clamp(min=1e-12)
    q = (t.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


class _Fp8Matmul(torch.autograd.Function):
    """``x @ w^T`` with both operands in fp8 (per-tensor scales) through ``torch._scaled_mm``, output bf16.

    Backward runs in bf16: ``grad_x = grad @ w`` with the master weight cast to bf16, ``grad_w = grad^T @ x``
    with x dequantized from the fp8 copy saved by forward (1 byte per element instead of 2).
    """

    @staticmethod
    def forward(ctx: Any, x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xq, x_scale = fp8_quantize(x2d)
        wq, w_scale = fp8_quantize(weight)
        out = torch._scaled_mm(
            xq, wq.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16, use_fast_accum=True
        )
        if isinstance(out, tuple):  # torch < 2.5 returned (out, amax)
            out = out[0]
        ctx.save_for_backward(xq, x_scale, weight)
        ctx.x_dtype = x2d.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xq, x_scale, weight = ctx.saved_tensors
        grad = grad.to(torch.bfloat16)
        x_deq = xq.to(torch.bfloat16) * x_scale.to(torch.bfloat16)
        grad_x = (grad @ weight.to(torch.bfloat16)).to(ctx.x_dtype)
        grad_w = (grad.t() @ x_deq).to(weight.dtype)
        return grad_x, grad_w


class Fp8Linear(nn.Linear):
    """A Linear whose forward multiplies in fp8 (e4m3, per-tensor scaling of input and weight, fp32 accumulate
    in ``torch._scaled_mm``, bf16 output) and whose backward runs in bf16; the weight stays a full-precision
    master. ``_scaled_mm`` needs both features and the token count divisible by 16, and (on a GPU) compute
    capability >= 8.9. Usable as ``linear_factory=Fp8Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = _Fp8Matmul.apply(x.reshape(-1, shape[-1]).contiguous(), self.weight)
        out = out.reshape(*shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out


# ---------------------------------------------------------------------------------------- KV cache


@dataclass
class KVCache:
    """Per-layer key/value cache of ``[B, H, max_len, D]`` tensors.

    In ``float8_e4m3fn`` the stored value is ``x / scale`` with one fp32 scale per layer and tensor
    (``k_scale[i]``, ``v_scale[i]``, 0-dim device tensors): :meth:`GPT.prefill` sets them from the prompt's
    max |k| and |v| (over 448, e4m3's max); decoding keeps them (values beyond are clamped). Without a
    prefill they stay 1.0; set them yourself (``cache.k_scale[i].fill_(s)``) for another calibration.
    In other dtypes the scales are 1.0 and unused. ``positions`` is ``arange(max_len)`` on the device,
    used to build decode masks without allocating.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    k_scale: list[torch.Tensor]
    v_scale: list[torch.Tensor]
    positions: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def quantized(self) -> bool:
        return self.dtype == torch.float8_e4m3fn

    def nbytes(self) -> int:
        """Bytes held by the k and v tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def _store(self, value: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if self.quantized:
            return (value.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(self.dtype)
        return value.to(self.dtype)

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (``[B, H, P, D]``) at positions ``0..P-1`` of ``layer``; fp8 caches calibrate
        the layer's scales from them first."""
        length = k.shape[2]
        if self.quantized:
            self.k_scale[layer].copy_((k.detach().abs().amax().float() / FP8_E4M3_MAX).clamp(min=1e-12))
            self.v_scale[layer].copy_((v.detach().abs().amax().float() / FP8_E4M3_MAX).clamp(min=1e-12))
        self.k[layer][:, :, :length].copy_(self._store(k, self.k_scale[layer]))
        self.v[layer][:, :, :length].copy_(self._store(v, self.v_scale[layer]))

    def write_at(self, layer: int, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> None:
        """Store ``k``, ``v`` (``[B, H, 1, D]``) at position ``index`` (a 1-element long device tensor)."""
        for cache, value, scale in ((self.k, k, self.k_scale), (self.v, v, self.v_scale)):
            stored = self._store(value, scale[layer])
            target = cache[layer]
            if self.quantized:  # index_copy_ has no float8 kernels: copy the bytes
                target, stored = target.view(torch.uint8), stored.view(torch.uint8)
            target.index_copy_(2, index, stored)

    def read(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's whole ``k`` and ``v`` (all ``max_len`` positions) in ``dtype``, dequantized when fp8."""
        k, v = self.k[layer], self.v[layer]
        if self.quantized:
            return k.to(dtype) * self.k_scale[layer].to(dtype), v.to(dtype) * self.v_scale[layer].to(dtype)
        return k.to(dtype), v.to(dtype)


def _position_index(pos: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``pos`` as a 1-element int64 tensor on ``device`` (no copy when it already is one there)."""
    if isinstance(pos, torch.Tensor):
        return pos.reshape(1).to(device=device, dtype=torch.long)
    return torch.tensor([int(pos)], device=device, dtype=torch.long)


# ---------------------------------------------------------------------------------------- modules


def _default_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection; see the module docstring for modes."""

    def __init__(self, cfg: GPTConfig, attention: str, linear: Callable[[int, int, bool], nn.Module]) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.attention = cfg.n_heads, cfg.head_dim, attention
        self.qkv = linear(cfg.d_model, 3 * cfg.d_model, False)
        self.proj = linear(cfg.d_model, cfg.d_model, False)
        # flash_decode: the decode kernels launched as programmatic dependents (Hopper; set on a decoder's copy)
        self.decode_pdl = False

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq, _ = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, S, D]
        return q, k, v

    def _merge(self, y: torch.Tensor) -> torch.Tensor:
        batch, _, seq, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention in ("sdpa", "flash_decode"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.attention == "math":
            seq = q.shape[2]
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v
        # "triton": the project's flash kernel; differentiable when a gradient is needed
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"attention='triton' needs bf16/fp16 activations, got {q.dtype}")
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            from kernels.attention.attention_grad import flash_attention

            return flash_attention(q, k, v, causal=True, **TRITON_ATTENTION_CONFIG)
        from kernels.attention.attention import attention as triton_attention

        return triton_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, **TRITON_ATTENTION_CONFIG)

    def _over_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One query position over the whole cache; ``mask`` ``[max_len]`` bool keeps positions ``<= pos``."""
        if self.attention == "math":
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v
        # sdpa (and triton, whose kernel has no arbitrary mask): SDPA with a boolean mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.view(1, 1, 1, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        return self._merge(self._causal(q, k, v))

    def prefill(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        q, k, v = self._split(x)
        cache.write_prefix(layer, k, v)
        return self._merge(self._causal(q, k, v))

    def decode(
        self, x: torch.Tensor, cache: KVCache, layer: int, index: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if self.attention == "flash_decode":  # the kernel writes the step's key and value and attends
            from kernels.attention.decode_attention import decode_attention

            # a quantized qkv whose split-K partials the attention kernel sums as it loads them (no kernel between)
            partials = self.qkv.partials(x) if hasattr(self.qkv, "partials") else None
            if partials is None:
                qkv = self.qkv(x).contiguous()
            else:
                qkv = partials.view(partials.shape[0], x.shape[0], 1, -1)
            y = decode_attention(qkv, cache.k[layer], cache.v[layer], cache.k_scale[layer], cache.v_scale[layer],
                                 index, self.n_heads, pdl=self.decode_pdl, out_dtype=x.dtype)  # fmt: skip
            return self.proj(y.view(x.shape[0], 1, -1))
        q, k, v = self._split(x)
        cache.write_at(layer, k, v, index)
        k_all, v_all = cache.read(layer, q.dtype)
        return self._merge(self._over_cache(q, k_all, v_all, mask))


class MLP(nn.Module):
    """``d_model -> d_ff -> d_model`` with GELU (tanh approximation) in between. ``fuse_gelu`` (set on a decoder
    whose ``fc`` is a packed :class:`models.quant_linear.QuantLinear`): the GELU is applied in that product's
    epilogue instead of by a kernel of its own."""

    def __init__(self, cfg: GPTConfig, linear: Callable[[int, int, bool], nn.Module]) -> None:
        super().__init__()
        self.fc = linear(cfg.d_model, cfg.ff, False)
        self.proj = linear(cfg.ff, cfg.d_model, False)
        self.fuse_gelu = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fuse_gelu:
            return self.proj(self.fc(x, activation="gelu_tanh"))
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, cfg: GPTConfig, attention: str, linear: Callable[[int, int, bool], nn.Module]) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.attn = CausalSelfAttention(cfg, attention, linear)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.mlp = MLP(cfg, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """The decoder. ``forward(tokens[B, S]) -> logits[B, S, V]``; see the module docstring.

    ``attention``: one of :data:`ATTENTION_MODES`. ``checkpoint_every=k``: activation checkpointing
    (``torch.utils.checkpoint``, non-reentrant) of blocks ``0, k, 2k, ...`` during training forward passes
    (0: none, 1: all). ``linear_factory(in_features, out_features, bias)`` builds every Linear of the blocks.
    """

    def __init__(
        self,
        cfg: GPTConfig,
        attention: str = "sdpa",
        checkpoint_every: int = 0,
        linear_factory: Callable[[int, int, bool], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be an int >= 0, got {checkpoint_every!r}")
        self.cfg, self.attention, self.checkpoint_every = cfg, attention, checkpoint_every
        linear = linear_factory or _default_linear
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attention, linear) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        # The LM head is tied to the embedding; a decoder may replace it by a quantized copy of that matrix
        # (models.quant_linear.quantize_head), the lookup keeping the bf16 one.
        self.lm_head: nn.Module | None = None

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(tokens) + self.pos_emb(positions).unsqueeze(0)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if self.lm_head is not None:
            return self.lm_head(x)
        return F.linear(x, self.tok_emb.weight)  # tied LM head

    def _check_tokens(self, tokens: torch.Tensor, limit: int) -> None:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [B, S], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > limit:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds {limit}")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self._check_tokens(tokens, self.cfg.seq_len)
        x = self._embed(tokens, torch.arange(tokens.shape[1], device=tokens.device))
        for i, block in enumerate(self.blocks):
            if self.checkpoint_every and i % self.checkpoint_every == 0 and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self._head(x)

    # ------------------------------------------------------------------ KV-cache decoding

    def init_cache(
        self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> KVCache:
        """An empty cache for ``batch`` sequences of up to ``max_len <= cfg.seq_len`` positions, zero-filled,
        in ``dtype`` (bf16/fp16/fp32, or ``torch.float8_e4m3fn`` with per-layer scales) on ``device``
        (default: the model's)."""
        if max_len <= 0 or max_len > self.cfg.seq_len:
            raise ValueError(f"max_len must be in [1, {self.cfg.seq_len}], got {max_len}")
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        device = torch.device(device) if device is not None else self.tok_emb.weight.device
        shape = (batch, self.cfg.n_heads, max_len, self.cfg.head_dim)
        layers = range(self.cfg.n_layers)
        return KVCache(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in layers],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in layers],
            k_scale=[torch.ones((), dtype=torch.float32, device=device) for _ in layers],
            v_scale=[torch.ones((), dtype=torch.float32, device=device) for _ in layers],
            positions=torch.arange(max_len, device=device),
        )

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the prompt ``tokens[B, P]`` (causal, as ``forward``), storing its k/v at positions ``0..P-1``
        of ``cache``; returns ``logits[B, P, V]``. The next :meth:`decode` position is ``P``."""
        self._check_tokens(tokens, cache.max_len)
        x = self._embed(tokens, torch.arange(tokens.shape[1], device=tokens.device))
        for i, block in enumerate(self.blocks):
            x = x + block.attn.prefill(block.norm1(x), cache, i)
            x = x + block.mlp(block.norm2(x))
        return self._head(x)

    def decode(self, tokens: torch.Tensor, cache: KVCache, pos: int | torch.Tensor) -> torch.Tensor:
        """One step: ``tokens[B, 1]`` at position ``pos`` (int or 0-dim long device tensor); appends its k/v
        to ``cache`` and attends over positions ``0..pos``. Returns ``logits[B, 1, V]``.

        With a device-tensor ``pos`` there is no host synchronization and every shape is static (attention
        runs over all ``max_len`` positions, later ones masked), so the call can be captured in a CUDA graph
        and replayed after ``pos.fill_(p)`` / ``pos.add_(1)``. ``pos`` must be ``< cache.max_len``
        (not checked: checking a device tensor would synchronize).
        """
        if tokens.ndim != 2 or tokens.shape[1] != 1:
            raise ValueError(f"tokens must be [B, 1], got shape {tuple(tokens.shape)}")
        if not isinstance(pos, torch.Tensor) and not 0 <= pos < cache.max_len:
            raise ValueError(f"pos must be in [0, {cache.max_len}), got {pos}")
        index = _position_index(pos, cache.positions.device)
        mask = cache.positions <= index  # [max_len] bool
        x = self._embed(tokens, index)
        for i, block in enumerate(self.blocks):
            x = x + block.attn.decode(block.norm1(x), cache, i, index, mask)
            x = x + block.mlp(block.norm2(x))
        return self._head(x)


# ---------------------------------------------------------------------------------------- helpers


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic initialization from ``seed`` (a generator on the parameters' device): every parameter of
    two or more dimensions ~ N(0, 0.02), biases 0, the other vectors (norm scales) 1. Parameters are visited
    in ``named_parameters()`` order, so one seed gives one model on a given device type."""
    params = list(model.named_parameters())
    if not params:
        return
    generator = torch.Generator(device=params[0][1].device).manual_seed(seed)
    for name, p in params:
        if p.ndim >= 2:
            if p.device != generator.device:
                generator = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, INIT_STD, generator=generator)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)


def make_model(
    cfg: GPTConfig, seed: int, device: torch.device | str, dtype: torch.dtype = torch.float32, **gpt_kwargs: Any
) -> GPT:
    """A :class:`GPT` built directly on ``device``, initialized by :func:`init_weights` (``seed``), then cast
    to ``dtype``. ``gpt_kwargs`` go to :class:`GPT` (attention, checkpoint_every, linear_factory)."""
    with torch.device(device):
        model = GPT(cfg, **gpt_kwargs)
    init_weights(model, seed)
    return model.to(dtype)


def replace_linears(model: GPT, convert: Callable[[nn.Linear], nn.Module]) -> GPT:
    """Replace every :class:`torch.nn.Linear` in the blocks by ``convert(linear)`` (in place; returns ``model``):
    e.g. weight-only quantization of an initialized model. The tied LM head is not a Linear and stays."""
    for block in model.blocks:
        for parent in block.modules():
            for child_name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, child_name, convert(child))
    return model


def synthetic_batch(
    cfg: GPTConfig, batch: int, seed: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)``, both ``[batch, seq_len]`` int64 on ``device``.

    ``tokens`` are uniform in ``[0, vocab_size)`` from a CPU ``torch.Generator`` seeded with ``seed`` (the same
    numbers on every device). ``targets = (tokens * 7 + 3) % vocab_size``: a fixed function of the current
    token, learnable through the embedding and the head, so the loss falls from ~ln(vocab_size) over steps
    (next-token targets of random tokens could not be learned).
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator, dtype=torch.long)
    targets = (tokens * 7 + 3) % cfg.vocab_size
    return tokens.to(device), targets.to(device)


def pretrain(model: GPT, steps: int, seed: int, micro_batch: int = 8, lr: float = 1e-3) -> list[float]:
    """Train ``model`` (fp32 parameters) in place for ``steps`` AdamW steps on :func:`synthetic_batch` data and
    return each step's loss. The batches use seeds ``seed + 1000 + n``; on CUDA the forward runs under bf16
    autocast with fused AdamW; the learning rate warms up linearly over the first tenth of the steps and
    gradients are clipped to norm 1. A non-finite loss raises FloatingPointError.

    Why: a seeded random GPT predicts almost uniformly (its top two logits lie a fraction of a unit
    apart), so any quantization flips its argmax and says nothing about a trained model, whose
    predictions have margins of several units. A few hundred steps of the synthetic task give the
    weights that property in seconds, with no download.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=cuda or None)
    warmup = max(1, steps // 10)
    losses: list[float] = []
    was_training = model.training
    model.train()
    for n in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (n + 1) / warmup)
        tokens, targets = synthetic_batch(model.cfg, micro_batch, seed + 1000 + n, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(tokens)
        loss = lm_loss(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"pretraining diverged at step {n}: loss {losses[-1]}")
    model.train(was_training)
    return losses


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[B, S, V]`` against ``targets[B, S]``, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
