"""The fused attention's backward pass (kernels/attention/attention_grad.py) against autograd through fp32 SDPA.

On a CPU the kernels run under the Triton interpreter (fp16 only: its bf16 ``tl.dot`` is wrong);
the GPU tests at the end check bf16 at a training shape. Kernel modules are imported inside the
tests (``TRITON_INTERPRET`` must be set before triton is imported; ``conftest.py`` does it).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).abs().max() / b.abs().max())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("shape", "forward", "backward"),
    [
        ((1, 2, 80, 32), (32, 16), (32, 16)),  # S not a multiple of either block
        ((2, 1, 64, 16), (16, 32), (16, 32)),  # BLOCK_M < BLOCK_N
        ((1, 1, 48, 64), (32, 32), (32, 16)),
    ],
    ids=["s80-d32", "s64-d16", "s48-d64"],
)
def test_gradients_match_sdpa_in_fp32(
    interpreter: None, shape: tuple[int, ...], forward: tuple[int, int], backward: tuple[int, int], causal: bool
) -> None:
    from kernels.attention.attention import attention
    from kernels.attention.attention_grad import attention_backward, flash_attention, reference_attention_grads

    gen = torch.Generator().manual_seed(sum(shape) + causal)
    q, k, v = (torch.randn(shape, generator=gen).to(torch.float16) for _ in range(3))
    grad_out = torch.randn(shape, generator=gen).to(torch.float16)
    ref_out, *ref_grads = reference_attention_grads(q, k, v, grad_out, causal)
    tiles = {"num_warps": 4, "num_stages": 1}
    # Through autograd (the forward's tiles; the backward's defaults for D).
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention(*leaves, causal=causal, BLOCK_M=forward[0], BLOCK_N=forward[1], **tiles)
    out.backward(grad_out)
    assert relative(out.detach(), ref_out) < 2e-3
    for name, leaf, ref in zip("qkv", leaves, ref_grads, strict=True):
        assert leaf.grad.dtype == torch.float16 and relative(leaf.grad, ref) < 5e-3, name
    # Directly, with other backward tiles: the same gradients up to rounding.
    lse = torch.empty(shape[:3], dtype=torch.float32)
    out = attention(q, k, v, causal=causal, lse=lse, BLOCK_M=forward[0], BLOCK_N=forward[1], **tiles)
    grads = attention_backward(
        q, k, v, out, lse, grad_out, causal=causal, tiles={"BLOCK_M": backward[0], "BLOCK_N": backward[1], **tiles}
    )
    for name, grad, ref in zip("qkv", grads, ref_grads, strict=True):
        assert relative(grad, ref) < 5e-3, name


def test_the_custom_ops_pass_torch_opcheck(interpreter: None) -> None:
    """Schema, autograd registration, fake tensors (what torch.compile propagates) and AOT dispatch."""
    import kernels.attention.attention_grad  # noqa: F401  (registers the ops)

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=gen).to(torch.float16).requires_grad_(True) for _ in range(3))
    report = torch.library.opcheck(torch.ops.gpu_tuner.flash_attention_fwd.default, (q, k, v, True, 16, 16, 4, 1))
    assert set(report.values()) == {"SUCCESS"}, report


def test_the_stored_log_sum_exp_is_that_of_the_scaled_scores(interpreter: None) -> None:
    from kernels.attention.attention import attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 40, 16, generator=gen).to(torch.float16) for _ in range(3))
    lse = torch.empty(1, 1, 40)
    attention(q, k, v, causal=True, lse=lse, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) / 4.0  # 1/sqrt(16)
    scores = scores.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), float("-inf"))
    expected = torch.logsumexp(scores, dim=-1) / torch.log(torch.tensor(2.0))
    assert torch.allclose(lse, expected, atol=2e-3)


def test_bad_inputs_are_refused_naming_them() -> None:
    from kernels.attention.attention import attention
    from kernels.attention.attention_grad import attention_backward

    q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)
    lse = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="grad_out"):
        attention_backward(q, q, q, q, lse, q.float(), causal=True)
    with pytest.raises(ValueError, match="lse"):
        attention_backward(q, q, q, q, lse[..., :8], q, causal=True)
    with pytest.raises(ValueError, match="lse"):
        attention(q, q, q, causal=True, lse=lse.half(), BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)


#: Run in a child process without TRITON_INTERPRET: compiles the backward kernels for sm_90 at the
#: head dims of BACKWARD_TILES, one JSON line per (head_dim, causal), or {"skip": reason}.
_AOT_SCRIPT = """
import json
from kernels.attention.attention_grad import BACKWARD_TILES, compile_backward_for_target
for head_dim in sorted(BACKWARD_TILES):
    for causal in (False, True):
        kernels = compile_or_skip(
            lambda: compile_backward_for_target(2, 16, 1000, head_dim, causal=causal, precision="bf16"))
        print(json.dumps({"head_dim": head_dim, "causal": causal, **{
            name: {"shared": k.metadata.shared, "wgmma": "wgmma.mma_async" in k.asm["ptx"]}
            for name, k in kernels.items()}}), flush=True)
"""


@pytest.mark.timeout(180)
def test_backward_kernels_compile_for_sm90_within_its_shared_memory(aot_child: Any) -> None:
    """Every head dim's backward tiles compile for an H200 (sm_90) and fit 227 KiB of shared memory; up to
    D=128 they use Hopper's wgmma (D=256's 32-row tiles, kept small for shared memory, do not)."""
    lines = aot_child(_AOT_SCRIPT, timeout=170)
    assert len(lines) == 10, lines
    for result in lines:
        for name in ("dkdv", "dq"):
            assert result[name]["shared"] <= 232448, result
            assert result[name]["wgmma"] or result["head_dim"] == 256, result


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_gradients_at_a_training_shape_on_gpu(causal: bool) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kernels.attention.attention_grad import flash_attention, reference_attention_grads
    from models.gpt import TRITON_ATTENTION_CONFIG

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 16, 2048, 128)  # the 1b preset's heads at sequence 2048
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    grad_out = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    ref_out, *ref_grads = reference_attention_grads(q, k, v, grad_out, causal)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention(*leaves, causal=causal, **TRITON_ATTENTION_CONFIG)
    out.backward(grad_out)
    assert relative(out.detach(), ref_out) < 2e-2
    # bf16 inputs, fp32 accumulation: the errors of SDPA's own bf16 flash backward on the same inputs.
    flash = [t.clone().requires_grad_(True) for t in (q, k, v)]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(*flash, is_causal=causal).backward(grad_out)
    for name, ours, theirs, ref in zip("qkv", leaves, flash, ref_grads, strict=True):
        assert relative(ours.grad, ref) < 2 * relative(theirs.grad, ref) + 1e-2, name
