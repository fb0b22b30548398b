"""Weight-only quantized ``nn.Linear`` for decoding: int8 / int4 weights, 16-bit activations.

:class:`QuantLinear` holds the weight of an ``nn.Linear`` (``out_features x in_features``)
transposed to ``(K, N) = (in_features, out_features)`` and quantized by
:func:`kernels.quant.quant_gemm.quantize_weights` (symmetric, one bf16/fp16 scale per group of
``group_size`` consecutive input features and per output feature, each scale the clipping of the
group's maximum with the least squared error). Its forward is ``y = x @ dequant(W) + bias`` with
fp32 accumulation, returned in x's dtype:

- on a GPU (CUDA tensors, bf16/fp16 activations, Triton compiling for real) through
  :func:`kernels.quant.quant_gemm.quant_matmul`, with one tile config per product shape: the one
  :func:`autotune_tiles` measured on this GPU, else the heuristic :func:`~models.quant_tiles.default_tile`; or, for a
  layer built with ``kernel="packed"`` (:func:`pack_linears`), through
  :func:`kernels.quant.quant_gemm_packed.packed_matmul` (int32 words, one launch per product), with the tile
  set by :meth:`QuantLinear.set_tile` for a row count (what a tuned study found), else
  :func:`~models.quant_tiles.packed_tile`, the H200's measured winners (tile heuristics, candidates and
  their measurement: :mod:`models.quant_tiles`);
- otherwise (CPU tensors, or the Triton interpreter) by dequantizing to fp32 and multiplying with
  torch: the same numbers as the kernel's scale-after-dot path (exact integer weights times an fp32
  scale, fp32 accumulation, one rounding to x's dtype), up to summation order.

:func:`quantize_linears` returns a copy of a model whose chosen ``nn.Linear`` modules are replaced by
``QuantLinear`` while every other parameter and buffer is shared with the original (no copy), so a
bf16 reference model and its int8 / int4 variants live side by side for the price of the quantized
weights alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels.runtime import interpreter_active
from models.quant_tiles import (
    _device_smem_bytes,
    default_tile,
    packed_product,
    packed_tile,
    tune_packed_tile,
    tune_tile,
)

#: Weight bit widths :class:`QuantLinear` supports (16 = not quantized: keep the ``nn.Linear``).
BITS: tuple[int, ...] = (4, 8)
#: The kernels a :class:`QuantLinear` runs on a GPU (and the weight layout it stores for them).
KERNELS: tuple[str, ...] = ("tiled", "packed")


#: The packed layers' operators take the layer's buffers and its tile as two lists, the knobs' names and values.
_PACKED_SCHEMA = (
    "(Tensor x, Tensor qweight, Tensor scales, int bits, int group_size, str[] names, int[] values) -> Tensor"
)


def _packed_call(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                 names: list[str], values: list[int], sum_partials: bool) -> torch.Tensor:  # fmt: skip
    """:func:`~models.quant_tiles.packed_product` of an operator's arguments."""
    from kernels.quant.quant_gemm_packed import PackedWeights

    weights = PackedWeights(qweight, scales, bits, group_size)
    return packed_product(x, weights, dict(zip(names, values, strict=True)), sum_partials=sum_partials)


@torch.library.custom_op("tuner::packed_linear", mutates_args=(), schema=_PACKED_SCHEMA)
def packed_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                  names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    """:func:`kernels.quant.quant_gemm_packed.packed_matmul` (tile ``dict(zip(names, values))``) as an opaque operator:
    torch.compile calls it as it is. Traced as a Triton kernel instead, its non-pure inline PTX (split-K's barrier)
    defeats Inductor's mutation analysis, which then takes every tensor argument, the weights too, as written."""
    return _packed_call(x, qweight, scales, bits, group_size, names, values, sum_partials=True)


@torch.library.custom_op("tuner::packed_linear_partials", mutates_args=(), schema=_PACKED_SCHEMA)
def packed_linear_partials(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                           names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    """The partial products ``(SPLIT_K, M, N)`` of a ``PARTIALS`` tile (fp32, or x's dtype with ``PARTIALS: 2``), as
    an opaque operator: the caller's ``.sum(0)`` is left to ``torch.compile``, which fuses it into the operation
    that reads the product."""
    return _packed_call(x, qweight, scales, bits, group_size, names, values, sum_partials=False)


@packed_linear_partials.register_fake
def _packed_linear_partials_shape(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int,
                                  group_size: int, names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    from kernels.quant.quant_gemm_packed import partials_dtype

    tile = dict(zip(names, values, strict=True))
    dtype = partials_dtype(tile["PARTIALS"], x.dtype)
    return x.new_empty((tile["SPLIT_K"], x.shape[0], qweight.shape[1]), dtype=dtype)


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                         names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    return x.new_empty((x.shape[0], qweight.shape[1]))


def autotune_tiles(
    model: nn.Module, m: int, dtype: torch.dtype = torch.bfloat16, partials: int = 0, pdl: bool = False
) -> dict[tuple[int, int], dict[str, int]]:
    """Measure the best tile (:func:`~models.quant_tiles.tune_tile`, :func:`~models.quant_tiles.tune_packed_tile`)
    for every distinct shape of ``model``'s CUDA :class:`QuantLinear` modules at ``m`` rows and make them use it;
    returns ``{(K, N): tile}``.
    ``partials``: packed layers may take ``PARTIALS`` tiles (from :data:`~models.quant_tiles.PARTIALS_MIN_ROWS`
    rows), whose split-K sums the model leaves to the operation after each product (for a model run under
    ``torch.compile``, which fuses them there): 1 (or True) with fp32 partials, 2 with partials in ``dtype``.
    ``pdl``: the packed layers' warp-specialized tiles are launched as programmatic dependents of the kernel before
    them (``PDL``).

    Call it before capturing a CUDA graph of the model (tuning launches kernels). On a model without
    CUDA QuantLinears (CPU, or the interpreter) it does nothing and returns ``{}``.
    """
    layers = [mod for mod in model.modules() if isinstance(mod, QuantLinear) and mod.qweight.is_cuda]
    if not layers or interpreter_active():
        return {}
    chosen: dict[tuple[int, int], dict[str, int]] = {}
    for layer in layers:
        shape = (layer.in_features, layer.out_features)
        if shape not in chosen:
            args = (m, layer.out_features, layer.in_features, layer.bits, layer.group_size, dtype, layer.qweight.device)
            chosen[shape] = tune_packed_tile(*args, partials, pdl) if layer.kernel == "packed" else tune_tile(*args)
        layer._tiles[(m, str(layer.qweight.device))] = chosen[shape]
    return chosen


class QuantLinear(nn.Module):
    """``y = x @ dequant(W) + bias`` with W stored as int8 / packed int4 and per-group scales.

    Build it with :meth:`from_linear`. ``use_kernel``: None picks the Triton kernel for CUDA
    bf16/fp16 inputs when the interpreter is off and the torch fallback otherwise; True / False
    force one (True also runs the kernel on CPU tensors under the interpreter, for tests).
    Buffers: ``qweight`` (int8 in :mod:`kernels.quant.quant_gemm`'s layout for ``kernel="tiled"``, int32
    words of :mod:`kernels.quant.quant_gemm_packed` for ``kernel="packed"``), ``scales`` (bf16/fp16),
    ``bias`` (or None); they move with ``.to(device)`` as any buffer does.
    """

    def __init__(
        self,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        group_size: int,
        use_kernel: bool | None = None,
        kernel: str = "tiled",
    ) -> None:
        super().__init__()
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.bits = bits
        self.group_size = group_size
        self.kernel = kernel
        self.in_features = qweight.shape[0] * ((32 if kernel == "packed" else 8) // bits)
        self.out_features = qweight.shape[1]
        self.use_kernel = use_kernel
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self._tiles: dict[tuple[int, str], dict[str, int]] = {}

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        bits: int,
        group_size: int,
        scale_dtype: torch.dtype = torch.bfloat16,
        use_kernel: bool | None = None,
        clip_search: bool = True,
    ) -> QuantLinear:
        """Quantize ``linear``'s weight (on its device); the bias is kept in ``scale_dtype``.

        ``clip_search`` (default on): each group's scale is the clipping of its maximum with the least
        squared error (:func:`kernels.quant.quant_gemm.quantize_weights`), which matters for int4.

        Raises ValueError when ``group_size`` does not divide ``in_features`` (or is not an even
        power of two) or ``bits`` is not 4 or 8.
        """
        from kernels.quant.quant_gemm import quantize_weights

        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        with torch.no_grad():
            weights = quantize_weights(
                linear.weight.detach().t().to(torch.float32), bits, group_size, scale_dtype, clip_search
            )
            bias = None if linear.bias is None else linear.bias.detach().to(scale_dtype).clone()
        return cls(weights.qweight, weights.scales, bias, bits, group_size, use_kernel)

    @property
    def weight_bytes(self) -> int:
        """Bytes of packed weights, scales and bias: what one forward reads of this layer."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.bias) if t is not None)

    def dequantized_weight(self) -> torch.Tensor:
        """``q * scale`` as an fp32 (K, N) = (in_features, out_features) matrix."""
        if self.kernel == "packed":
            return self._packed_weights().dequantize()
        from kernels.quant.quant_gemm import QuantizedWeights

        return QuantizedWeights(self.qweight, self.scales, self.bits, self.group_size).dequantize()

    def _packed_weights(self) -> Any:
        from kernels.quant.quant_gemm_packed import PackedWeights

        return PackedWeights(self.qweight, self.scales, self.bits, self.group_size)

    def packed(self) -> QuantLinear:
        """The same layer (values, scales, bias shared) for the packed kernel: its words made from this layout."""
        if self.kernel == "packed":
            return self
        from kernels.quant.quant_gemm_packed import repack

        words = repack(self.qweight, self.scales, self.bits, self.group_size).qweight
        return QuantLinear(words, self.scales, self.bias, self.bits, self.group_size, self.use_kernel, "packed")

    def set_tile(self, m: int, tile: dict[str, int], device: torch.device | str = "cuda") -> None:
        """Use ``tile`` for products of ``m`` rows on ``device`` (a tuned config; checked at the next forward)."""
        self._tiles[(m, str(torch.device(device)))] = dict(tile)

    def _kernel_wanted(self, x: torch.Tensor) -> bool:
        if self.use_kernel is not None:
            return self.use_kernel
        return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and not interpreter_active()

    def _tile(self, m: int, device: torch.device) -> dict[str, int]:
        key = (m, str(device))
        tile = self._tiles.get(key)
        if tile is None:
            if self.kernel == "packed":
                tile = packed_tile(m, self.out_features, self.in_features, self.bits)
            else:
                smem = _device_smem_bytes(device) if device.type == "cuda" else None
                tile = default_tile(m, self.out_features, self.in_features, self.bits, self.group_size, smem)
            self._tiles[key] = tile
        return tile

    def partials(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x``'s product as its ``SPLIT_K`` partials ``(SPLIT_K, M, N)`` (fp32 or x's dtype) where this layer runs
        it on the packed kernel with a ``PARTIALS`` tile and no bias, for a next operation that sums them itself
        (:func:`kernels.attention.decode_attention.decode_attention`); None otherwise (call the layer)."""
        x2 = x.reshape(-1, self.in_features)
        if self.bias is not None or self.kernel != "packed" or not self._kernel_wanted(x2):
            return None
        tile = self._tile(x2.shape[0], x2.device)
        return packed_linear_partials(*self._op_args(x2, tile)) if tile.get("PARTIALS") else None

    def _op_args(self, x2: torch.Tensor, tile: dict[str, int]) -> tuple[Any, ...]:
        """The packed operators' arguments for the (M, K) ``x2`` and ``tile`` (its knobs as names and values)."""
        return x2, self.qweight, self.scales, self.bits, self.group_size, list(tile), [int(v) for v in tile.values()]

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """``x @ dequant(W) + bias``; ``activation`` ``"gelu_tanh"``: GELU (tanh approximation) of that, applied in
        the packed kernel's epilogue (its ``ACT``) where the product runs there without a bias or ``PARTIALS``,
        else by ``F.gelu`` after it."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        if activation not in (None, "gelu_tanh"):
            raise ValueError(f"activation must be None or 'gelu_tanh', got {activation!r}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        fused = False
        if self._kernel_wanted(x2) and self.kernel == "packed":
            tile = self._tile(x2.shape[0], x2.device)
            if activation and self.bias is None and not tile.get("PARTIALS"):
                tile, fused = {**tile, "ACT": 1}, True
            args = self._op_args(x2, tile)
            if tile.get("PARTIALS"):  # summed (in fp32) by whatever reads y: under torch.compile, in that kernel
                y = packed_linear_partials(*args).sum(0, dtype=torch.float32).to(x.dtype)
            else:
                y = packed_linear(*args)
        elif self._kernel_wanted(x2):
            from kernels.quant.quant_gemm import quant_matmul

            y = quant_matmul(
                x2,
                self.qweight,
                self.scales,
                bits=self.bits,
                group_size=self.group_size,
                **self._tile(x2.shape[0], x2.device),
            )
        else:
            y = (x2.to(torch.float32) @ self.dequantized_weight()).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        if activation and not fused:
            y = F.gelu(y, approximate="tanh")
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, kernel={self.kernel}"
        )


def quantize_linears(
    model: nn.Module,
    bits: int,
    group_size: int,
    select: Callable[[str, nn.Linear], bool] | None = None,
    scale_dtype: torch.dtype = torch.bfloat16,
    use_kernel: bool | None = None,
    clip_search: bool = True,
    prebuilt: dict[str, QuantLinear] | None = None,
) -> nn.Module:
    """A copy of ``model`` with the selected ``nn.Linear`` modules replaced by :class:`QuantLinear`.

    ``select(qualified_name, linear)`` picks the layers (default: every ``nn.Linear``); a layer named
    in ``prebuilt`` becomes that module (quantized elsewhere, e.g. by :mod:`models.gptq`). Every other
    parameter and buffer is the original tensor, shared, not copied; only the module objects are new.
    The original is left unchanged. A linear whose weight is also used elsewhere (tied to an
    embedding) is quantized in this copy only; the other user keeps the unquantized tensor.
    """
    memo: dict[int, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and prebuilt and name in prebuilt:
            memo[id(module)] = prebuilt[name]
        elif isinstance(module, nn.Linear) and (select is None or select(name, module)):
            memo[id(module)] = QuantLinear.from_linear(module, bits, group_size, scale_dtype, use_kernel, clip_search)
    for tensor in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(tensor), tensor)
    return copy.deepcopy(model, memo)


def quantize_decoder(model: nn.Module, bits: int, group_size: int, int8_first_blocks: int = 0) -> nn.Module:
    """A copy of a GPT (``models.gpt``) with its block Linears quantized to ``bits``, the first
    ``int8_first_blocks`` blocks' Linears to int8 instead (same group size).

    Why the first blocks: they see the raw token embeddings, and their quantization error passes through
    every later block. On CPU (8-block model, d_model 256, pretrained 60 steps, int4 group 64), keeping
    block 0 in int8 raised top-1 agreement with the bf16 model from 0.941 to 0.988 and halved the mean
    logit error; keeping the last block instead changed nothing.
    """
    if int8_first_blocks and bits != 4:
        raise ValueError(f"int8_first_blocks applies to int4 weights, got bits={bits}")
    keep = tuple(f"blocks.{i}." for i in range(int8_first_blocks))
    if keep:
        model = quantize_linears(model, 8, group_size, select=lambda name, _: name.startswith(keep))
    return quantize_linears(model, bits, group_size)


def quantize_head(model: nn.Module, bits: int, group_size: int, scale_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A copy of a GPT (``models.gpt``) whose tied LM head (``logits = x @ E^T``) is a :class:`QuantLinear` of E
    (round-to-nearest with the clipping search, ``bits`` 8 or 4): at the 1B preset the head is a 32000 x 2048
    product, 131 MB in bf16, the largest of the step. The embedding lookup keeps E as it is; every other module,
    parameter and buffer is shared with the original."""
    weight = model.tok_emb.weight
    with torch.device("meta"):
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    head = QuantLinear.from_linear(linear, bits, group_size, scale_dtype)
    memo: dict[int, Any] = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    copied = copy.deepcopy(model, memo)
    copied.lm_head = head
    return copied


def pack_linears(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose :class:`QuantLinear` layers run the packed kernel (:meth:`QuantLinear.packed`);
    every other module, parameter and buffer is shared with the original."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, QuantLinear):
            memo[id(module)] = module.packed()
    for tensor in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(tensor), tensor)
    return copy.deepcopy(model, memo)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of a model's distinct parameters and buffers (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total
