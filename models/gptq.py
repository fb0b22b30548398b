"""GPTQ: weight-only quantization that corrects each column's rounding error with the next ones.

Round-to-nearest (:func:`kernels.quant.quant_gemm.quantize_weights`) rounds every weight on its own. GPTQ
(Frantar et al., 2023, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers") quantizes a Linear's input features one after the other and spreads each rounding
error over the features not yet quantized, weighted by the inverse of the layer's input Hessian
``H = X^T X`` on calibration activations ``X``, so that the layer's *output* on such inputs moves
least. The result is the same format (int8 values, one scale per group of ``group_size`` input
features and output column), read by the same kernel: only its accuracy changes.

Here the scales of a group are chosen when its first feature is reached, from the weights as the
earlier errors have updated them, with the clipping search of round-to-nearest.
:func:`gptq_decoder` quantizes a GPT (``models.gpt``) block by block, each block's Hessians
measured on the outputs of the blocks already quantized.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

#: Dampening added to the Hessian's diagonal, as a fraction of its mean (the paper's 1%).
DAMP = 0.01
#: Features processed per lazy-batch update (the paper's 128).
BLOCK = 128


def hessian_of(inputs: torch.Tensor) -> torch.Tensor:
    """``2 X^T X / n`` in fp32 for ``inputs`` ``[..., K]`` (``n`` rows of ``K`` features)."""
    x = inputs.reshape(-1, inputs.shape[-1]).to(torch.float32)
    return 2.0 * (x.t() @ x) / max(1, x.shape[0])


def gptq_quantize(
    w: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int,
    scale_dtype: torch.dtype = torch.bfloat16,
    clip_search: bool = True,
    damp: float = DAMP,
) -> Any:
    """GPTQ of an fp32 ``(K, N)`` matrix (``K`` input features) under a ``(K, K)`` input Hessian.

    Returns :class:`kernels.quant.quant_gemm.QuantizedWeights` in the layout round-to-nearest produces. With
    ``hessian`` the identity (uncorrelated unit inputs) no error is propagated and the result is
    round-to-nearest's. Raises ValueError for shapes that do not match or a group size that does not
    divide ``K``.
    """
    from kernels.quant.quant_gemm import BITS, QMAX, QuantizedWeights, pack_int4, quantize_groups

    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if w.ndim != 2 or hessian.shape != (w.shape[0], w.shape[0]):
        raise ValueError(f"need w (K, N) and hessian (K, K), got {tuple(w.shape)} and {tuple(hessian.shape)}")
    k, n = w.shape
    if group_size < 2 or group_size & (group_size - 1) or k % group_size:
        raise ValueError(f"group_size must be an even power of two dividing K={k}, got {group_size!r}")
    qmax = QMAX[bits]
    # GPTQ works on rows of output channels: W is (N, K) here, columns are input features.
    weight = w.t().to(torch.float32).clone()
    h = hessian.to(device=weight.device, dtype=torch.float32).clone()
    dead = torch.diag(h) == 0  # features never active in calibration: any value is exact
    h[dead, dead] = 1.0
    weight[:, dead] = 0.0
    h.diagonal().add_(damp * torch.mean(torch.diag(h)))
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    q_all = torch.zeros_like(weight)
    scales = torch.empty((k // group_size, n), dtype=scale_dtype, device=weight.device)
    group_scale = torch.empty(n, device=weight.device)
    step = max(BLOCK, group_size)  # powers of two: every group lies inside one lazy block
    for start in range(0, k, step):
        end = min(start + step, k)
        block = weight[:, start:end].clone()
        errors = torch.zeros_like(block)
        h_block = h_inv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            if col % group_size == 0:
                # The group's scales, from the weights the earlier errors have moved.
                group = block[:, i : i + group_size].t()
                s = quantize_groups(group[None], bits, scale_dtype, clip_search)[0][0]
                scales[col // group_size] = s
                group_scale = s.to(torch.float32)
            column = block[:, i]
            q = torch.round(column / group_scale).clamp(-qmax, qmax)
            q_all[:, col] = q
            error = (column - q * group_scale) / h_block[i, i]
            block[:, i:] -= error[:, None] * h_block[i, i:][None, :]
            errors[:, i] = error
        weight[:, end:] -= errors @ h_inv[start:end, end:]
    q_int = q_all.t().contiguous().to(torch.int8)
    qweight = q_int if bits == 8 else pack_int4(q_int).contiguous()
    return QuantizedWeights(qweight, scales.contiguous(), bits, group_size)


def gptq_layers(
    model: nn.Module,
    bits: int,
    group_size: int,
    calibration: torch.Tensor,
    int8_first_blocks: int = 0,
    scale_dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    """GPTQ of a GPT's block Linears on ``calibration`` tokens ``[B, S]``: ``{qualified name: QuantLinear}``.

    Blocks are done in order; each block's Linears get their Hessians from a forward pass of a copy
    of the model whose earlier blocks already carry their quantized weights, so later blocks correct
    for the error of earlier ones (GPTQ's sequential mode, one pass per block). The first
    ``int8_first_blocks`` blocks are quantized to int8, as in
    :func:`models.quant_linear.quantize_decoder`. ``model`` is left unchanged.
    """
    from models.quant_linear import QuantLinear

    if int8_first_blocks and bits != 4:
        raise ValueError(f"int8_first_blocks applies to int4 weights, got bits={bits}")
    if calibration.ndim != 2:
        raise ValueError(f"calibration must be tokens [B, S], got shape {tuple(calibration.shape)}")
    work = copy.deepcopy(model)  # its Linears take the quantized-then-dequantized weights as we go
    layers: dict[str, QuantLinear] = {}
    for index, block in enumerate(work.blocks):
        block_bits = 8 if index < int8_first_blocks else bits
        linears = {name: m for name, m in block.named_modules() if isinstance(m, nn.Linear)}
        hessians = _input_hessians(work, linears, calibration)
        for name, linear in linears.items():
            with torch.no_grad():
                w = linear.weight.detach().t().to(torch.float32)
                weights = gptq_quantize(w, hessians.pop(name), block_bits, group_size, scale_dtype)
                bias = None if linear.bias is None else linear.bias.detach().to(scale_dtype).clone()
                layers[f"blocks.{index}.{name}"] = QuantLinear(
                    weights.qweight, weights.scales, bias, block_bits, group_size
                )
                linear.weight.copy_(weights.dequantize().t().to(linear.weight.dtype))
    return layers


def _input_hessians(
    model: nn.Module, linears: dict[str, nn.Module], calibration: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The input Hessian of each of ``linears`` over one forward pass of ``model`` on ``calibration``."""
    hessians: dict[str, torch.Tensor] = {}

    def record(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            h = hessian_of(args[0])
            hessians[name] = h if name not in hessians else hessians[name] + h

        return hook

    handles = [m.register_forward_pre_hook(record(name)) for name, m in linears.items()]
    try:
        with torch.no_grad():
            model(calibration)
    finally:
        for handle in handles:
            handle.remove()
    return hessians


def gptq_decoder(
    model: nn.Module,
    bits: int,
    group_size: int,
    calibration: torch.Tensor,
    int8_first_blocks: int = 0,
    scale_dtype: torch.dtype = torch.bfloat16,
) -> nn.Module:
    """A copy of a GPT with its block Linears quantized by GPTQ (:func:`gptq_layers`); every other
    parameter is shared with ``model``, which is left unchanged."""
    from models.quant_linear import quantize_linears

    layers = gptq_layers(model, bits, group_size, calibration, int8_first_blocks, scale_dtype)
    return quantize_linears(model, bits, group_size, select=lambda name, _: name in layers, prebuilt=layers)
