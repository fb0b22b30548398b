"""GPTQ (models/gptq.py): the round-to-nearest format, less output error on correlated inputs."""

from __future__ import annotations

import pytest
import torch

from kernels.quant.quant_gemm import quantize_weights
from models.config import PRESETS
from models.gpt import make_model
from models.gptq import gptq_decoder, gptq_quantize, hessian_of
from models.quant_linear import QuantLinear, quantize_decoder

pytestmark = pytest.mark.timeout(120)


def correlated_inputs(rows: int, k: int, seed: int) -> torch.Tensor:
    """Activations with a few strong shared directions and uneven feature scales, as a layer's inputs are."""
    shape = torch.Generator().manual_seed(k)  # one distribution per width; ``seed`` draws its samples
    basis = torch.randn(8, k, generator=shape)
    scale = torch.rand(k, generator=shape) * 2 + 0.1
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(rows, 8, generator=gen) * 3.0
    return (mix @ basis + 0.3 * torch.randn(rows, k, generator=gen)) * scale


@pytest.mark.parametrize("bits", [4, 8])
def test_with_an_identity_hessian_gptq_is_round_to_nearest(bits: int) -> None:
    w = torch.randn(256, 48, generator=torch.Generator().manual_seed(0))
    rtn = quantize_weights(w, bits, 64, clip_search=True)
    gptq = gptq_quantize(w, torch.eye(256), bits, 64)
    assert torch.equal(gptq.qweight, rtn.qweight) and torch.equal(gptq.scales, rtn.scales)
    assert (gptq.bits, gptq.group_size) == (bits, 64)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 128), (8, 64)])
def test_gptq_moves_the_layer_output_less_than_round_to_nearest(bits: int, group: int) -> None:
    k, n = 256, 64
    w = torch.randn(k, n, generator=torch.Generator().manual_seed(1)) / k**0.5
    calibration = correlated_inputs(2048, k, seed=2)
    held_out = correlated_inputs(1024, k, seed=3)  # the error is measured on inputs GPTQ did not see
    rtn = quantize_weights(w, bits, group, clip_search=True)
    gptq = gptq_quantize(w, hessian_of(calibration), bits, group)
    assert gptq.qweight.shape == rtn.qweight.shape and gptq.scales.shape == rtn.scales.shape
    exact = held_out @ w
    rtn_error = (held_out @ rtn.dequantize() - exact).pow(2).mean()
    gptq_error = (held_out @ gptq.dequantize() - exact).pow(2).mean()
    assert gptq_error < 0.7 * rtn_error, (float(gptq_error), float(rtn_error))


def test_features_never_active_are_zeroed_without_nans() -> None:
    k, n = 128, 16
    x = correlated_inputs(512, k, seed=4)
    x[:, 5] = 0.0
    w = torch.randn(k, n, generator=torch.Generator().manual_seed(5))
    q = gptq_quantize(w, hessian_of(x), 4, 32).dequantize()
    assert torch.isfinite(q).all() and torch.all(q[5] == 0)


def test_gptq_refuses_bad_shapes_and_groups_naming_them() -> None:
    w = torch.randn(64, 8)
    with pytest.raises(ValueError, match="hessian"):
        gptq_quantize(w, torch.eye(32), 4, 32)
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize(w, torch.eye(64), 4, 48)
    with pytest.raises(ValueError, match="bits"):
        gptq_quantize(w, torch.eye(64), 3, 32)


def test_gptq_decoder_quantizes_every_block_linear_and_leaves_the_model_alone() -> None:
    cfg = PRESETS["tiny"]
    base = make_model(cfg, 0, "cpu", torch.float32).requires_grad_(False).eval()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    calibration = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=torch.Generator().manual_seed(6))
    model = gptq_decoder(base, 4, 32, calibration, int8_first_blocks=1)
    bits = {name: m.bits for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(bits) == 4 * cfg.n_layers
    assert {b for n, b in bits.items() if n.startswith("blocks.0.")} == {8}
    assert {b for n, b in bits.items() if n.startswith("blocks.1.")} == {4}
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())
    assert model.tok_emb.weight is base.tok_emb.weight
    # On held-out tokens, closer to the unquantized model than round-to-nearest.
    tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        exact = base(tokens)
        gptq_error = (model(tokens) - exact).abs().mean()
        rtn_error = (quantize_decoder(base, 4, 32, int8_first_blocks=1)(tokens) - exact).abs().mean()
    assert gptq_error < rtn_error
    with pytest.raises(ValueError, match="int4"):
        gptq_decoder(base, 8, 32, calibration, int8_first_blocks=1)
    with pytest.raises(ValueError, match="calibration"):
        gptq_decoder(base, 4, 32, calibration[0])
