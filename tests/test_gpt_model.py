"""The shared GPT of ``models/gpt.py``: shapes, parameter counts, attention modes, checkpointing, the fp8
Linear, and KV-cache decoding against the full forward pass. CPU with the "tiny" preset; the last tests
need a CUDA GPU (bf16 cache, CUDA-graph capture of decode, fp8 on Hopper)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from models.gpt import (  # noqa: E402
    GPT,
    PRESETS,
    Fp8Linear,
    GPTConfig,
    fp8_quantize,
    lm_loss,
    make_model,
    model_flops_per_token,
    replace_linears,
    resolve_config,
    synthetic_batch,
)

TINY = PRESETS["tiny"]


def _tokens(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_config_validation_and_presets() -> None:
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig(vocab_size=10, n_layers=1, d_model=30, n_heads=4, seq_len=8)
    with pytest.raises(ValueError, match="d_model"):
        GPTConfig(vocab_size=10, n_layers=1, d_model=0, n_heads=1, seq_len=8)
    with pytest.raises(ValueError, match="model"):
        resolve_config("nope")
    with pytest.raises(ValueError, match="unknown"):
        resolve_config({"vocab_size": 8, "layers": 2})
    assert resolve_config({**TINY.to_dict(), "d_ff": 96}).ff == 96
    assert (TINY.vocab_size, TINY.n_layers, TINY.d_model, TINY.n_heads, TINY.seq_len) == (256, 2, 64, 4, 32)
    big = PRESETS["1b"]
    assert big.seq_len == 2048 and big.d_model == 2048 and big.n_heads == 16
    assert 0.95e9 <= big.n_params() <= 1.05e9
    assert {"125m", "350m"} <= set(PRESETS)


def test_n_params_matches_the_module_and_flops_formula() -> None:
    model = make_model(TINY, seed=0, device="cpu")
    assert sum(p.numel() for p in model.parameters()) == TINY.n_params()
    tables = TINY.vocab_size * TINY.d_model + TINY.seq_len * TINY.d_model
    assert TINY.n_params(embedding=False) == TINY.n_params() - tables
    n = TINY.n_params(embedding=False) + TINY.vocab_size * TINY.d_model
    attn = 4 * TINY.n_layers * TINY.seq_len * TINY.d_model
    assert model_flops_per_token(TINY, training=True) == pytest.approx(6 * n + 3 * attn)
    assert model_flops_per_token(TINY, training=True, causal_halved=True) == pytest.approx(6 * n + 1.5 * attn)
    assert model_flops_per_token(TINY, training=False) == pytest.approx(2 * n + attn)
    assert model_flops_per_token(TINY, training=False, context_len=1) == pytest.approx(
        2 * n + 4 * TINY.n_layers * TINY.d_model
    )


def test_make_model_is_deterministic_and_seeded() -> None:
    a, b, c = (make_model(TINY, seed=s, device="cpu") for s in (3, 3, 4))
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if pa.ndim >= 2:
            assert not torch.equal(pa, pc), name
            assert abs(pa.std().item() - 0.02) < 0.005, name
    tokens, targets = synthetic_batch(TINY, 3, seed=5, device="cpu")
    again, _ = synthetic_batch(TINY, 3, seed=5, device="cpu")
    assert tokens.shape == (3, TINY.seq_len) and torch.equal(tokens, again)
    assert torch.equal(targets, (tokens * 7 + 3) % TINY.vocab_size)
    assert make_model(TINY, seed=0, device="cpu", dtype=torch.float16).tok_emb.weight.dtype == torch.float16


def test_forward_shapes_causality_and_attention_modes_agree() -> None:
    tokens = _tokens(2, TINY.seq_len)
    sdpa = make_model(TINY, seed=1, device="cpu")
    math_model = make_model(TINY, seed=1, device="cpu", attention="math")
    with torch.no_grad():
        logits = sdpa(tokens)
        assert logits.shape == (2, TINY.seq_len, TINY.vocab_size)
        torch.testing.assert_close(math_model(tokens), logits, rtol=1e-5, atol=1e-5)
        # causal: changing the last token changes no earlier logits
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % TINY.vocab_size
        other = sdpa(changed)
        torch.testing.assert_close(other[:, :-1], logits[:, :-1])
        assert not torch.allclose(other[:, -1], logits[:, -1])
    loss = lm_loss(logits, (tokens * 7 + 3) % TINY.vocab_size)
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.5  # near-uniform at init
    with pytest.raises(ValueError, match="attention"):
        GPT(TINY, attention="flash")
    with pytest.raises(ValueError, match="checkpoint_every"):
        GPT(TINY, checkpoint_every=-1)


def test_triton_attention_matches_sdpa_forward_and_backward(interpreter: None) -> None:
    """The project's flash kernel (fp16 under the interpreter) inside the model: logits and gradients."""
    tokens, targets = synthetic_batch(TINY, 2, seed=3, device="cpu")
    ref = make_model(TINY, seed=2, device="cpu", dtype=torch.float16)
    tri = make_model(TINY, seed=2, device="cpu", dtype=torch.float16, attention="triton")
    with torch.no_grad():
        torch.testing.assert_close(tri(tokens).float(), ref(tokens).float(), rtol=2e-2, atol=2e-2)
    for model in (ref, tri):
        lm_loss(model(tokens), targets).backward()
    for (name, a), b in zip(tri.named_parameters(), ref.parameters(), strict=True):
        assert (
            float((a.grad.float() - b.grad.float()).abs().max()) <= 0.02 * float(b.grad.float().abs().max()) + 1e-3
        ), name
    with pytest.raises(RuntimeError, match="bf16/fp16"):
        make_model(TINY, seed=2, device="cpu", attention="triton")(tokens)  # fp32 activations


def test_checkpointing_gives_the_same_loss_and_gradients() -> None:
    tokens, targets = synthetic_batch(TINY, 2, seed=0, device="cpu")
    grads = []
    for every in (0, 1, 2):
        model = make_model(TINY, seed=7, device="cpu", checkpoint_every=every)
        loss = lm_loss(model(tokens), targets)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    for loss, g in grads[1:]:
        torch.testing.assert_close(loss, grads[0][0])
        for a, b in zip(g, grads[0][1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fp8_linear_forward_and_backward_close_to_linear() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64)
    ref = torch.nn.Linear(64, 96, bias=True)
    fp8 = Fp8Linear(64, 96, bias=True)
    fp8.load_state_dict(ref.state_dict())
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(xr), fp8(xf)
    assert out.dtype == torch.bfloat16 and out.shape == out_ref.shape
    rel = ((out.float() - out_ref).abs().max() / out_ref.abs().max()).item()
    assert 0 < rel < 0.1  # e4m3 has 3 mantissa bits: a few % error, never exact
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    out.float().backward(grad)
    for a, b in ((xf.grad, xr.grad), (fp8.weight.grad, ref.weight.grad), (fp8.bias.grad, ref.bias.grad)):
        assert a.dtype == torch.float32
        assert ((a - b).abs().max() / b.abs().max()).item() < 0.1
    q, scale = fp8_quantize(torch.zeros(16, 16))
    assert torch.all(q.float() == 0) and scale.item() > 0


def test_replace_linears_swaps_every_block_linear() -> None:
    model = make_model(TINY, seed=0, device="cpu")
    tokens = _tokens(2, 8)  # 16 rows: _scaled_mm wants multiples of 16
    ref_logits = model(tokens).detach()

    def convert(linear: torch.nn.Linear) -> torch.nn.Module:
        new = Fp8Linear(linear.in_features, linear.out_features, bias=False)
        new.weight = linear.weight
        return new

    replace_linears(model, convert)
    kinds = [type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert kinds == ["Fp8Linear"] * 4 * TINY.n_layers
    logits = model(tokens).detach()
    assert ((logits.float() - ref_logits).abs().max() / ref_logits.abs().max()).item() < 0.1


@pytest.mark.parametrize("attention", ["sdpa", "math", "flash_decode"])
def test_prefill_then_decode_matches_forward(attention: str) -> None:
    """Prefill 10 tokens, decode the rest one by one (int and tensor positions): the same logits as one
    forward pass over the whole sequence, in an fp32 cache (``flash_decode``: the Triton decode kernel writes the
    cache and attends, under the interpreter on a CPU)."""
    model = make_model(TINY, seed=3, device="cpu", attention=attention)
    tokens = _tokens(2, 20, seed=1)
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache(2, TINY.seq_len, torch.float32)
        assert cache.k[0].shape == (2, TINY.n_heads, TINY.seq_len, TINY.head_dim) and not cache.quantized
        torch.testing.assert_close(model.prefill(tokens[:, :10], cache), full[:, :10], rtol=1e-5, atol=1e-5)
        for p in range(10, 20):
            pos = p if p % 2 else torch.tensor(p)
            step = model.decode(tokens[:, p : p + 1], cache, pos)
            assert step.shape == (2, 1, TINY.vocab_size)
            torch.testing.assert_close(step, full[:, p : p + 1], rtol=1e-5, atol=1e-5)
        assert torch.all(cache.k[1][:, :, 20:] == 0)  # nothing written past the last position


@pytest.mark.parametrize("attention", ["sdpa", "flash_decode"])
def test_decode_from_empty_cache_and_fp8_cache(attention: str) -> None:
    model = make_model(TINY, seed=4, device="cpu", attention=attention)
    tokens = _tokens(1, 12, seed=2)
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache(1, 16, torch.float32)
        steps = torch.cat([model.decode(tokens[:, p : p + 1], cache, p) for p in range(12)], dim=1)
        torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
        fp8 = model.init_cache(1, 16, torch.float8_e4m3fn)
        model.prefill(tokens[:, :6], fp8)
        assert fp8.quantized and fp8.k_scale[0].item() != 1.0
        assert fp8.nbytes() == 2 * TINY.n_layers * 16 * TINY.d_model
        out = torch.cat([model.decode(tokens[:, p : p + 1], fp8, torch.tensor(p)) for p in range(6, 12)], dim=1)
        rel = ((out - full[:, 6:]).abs().max() / full[:, 6:].abs().max()).item()
        assert 0 < rel < 0.05
    with pytest.raises(ValueError, match="max_len"):
        model.init_cache(1, TINY.seq_len + 1, torch.float32)
    with pytest.raises(ValueError, match="pos"):
        model.decode(tokens[:, :1], cache, 16)


# --------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("attention", ["sdpa", "flash_decode"])
def test_decode_cuda_graph_matches_eager_on_gpu(cache_dtype: str, attention: str) -> None:
    """A captured decode step replayed at advancing positions gives the eager steps' logits; ``flash_decode``'s
    eager steps also match SDPA's (the split kernel and its cache write against ``index_copy_`` and SDPA)."""
    cfg = GPTConfig(vocab_size=512, n_layers=2, d_model=256, n_heads=4, seq_len=128)
    model = make_model(cfg, seed=0, device="cuda", dtype=torch.bfloat16, attention=attention)
    sdpa = make_model(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab_size, (4, 40), device="cuda")
    dtype = getattr(torch, cache_dtype)
    with torch.no_grad():
        eager_cache = model.init_cache(4, 64, dtype)
        graph_cache = model.init_cache(4, 64, dtype)
        model.prefill(tokens[:, :32], eager_cache)
        model.prefill(tokens[:, :32], graph_cache)
        eager = [model.decode(tokens[:, p : p + 1], eager_cache, p) for p in range(32, 40)]
        sdpa_cache = sdpa.init_cache(4, 64, dtype)
        sdpa.prefill(tokens[:, :32], sdpa_cache)
        for p in range(32, 40):
            torch.testing.assert_close(sdpa.decode(tokens[:, p : p + 1], sdpa_cache, p), eager[p - 32], rtol=3e-2,
                                       atol=3e-2)  # fmt: skip
        static_tok = tokens[:, 32:33].clone()
        pos = torch.tensor(32, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up on a side stream, as capture requires
            model.decode(static_tok, graph_cache, pos)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model.decode(static_tok, graph_cache, pos)
        for p in range(32, 40):
            static_tok.copy_(tokens[:, p : p + 1])
            pos.fill_(p)
            graph.replay()
            torch.testing.assert_close(out, eager[p - 32], rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs fp8 (sm_89+)"
)
def test_fp8_linear_on_gpu() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 128, 512, device="cuda", requires_grad=True)
    ref = torch.nn.Linear(512, 1024, bias=False, device="cuda")
    fp8 = Fp8Linear(512, 1024, bias=False, device="cuda")
    fp8.weight.data.copy_(ref.weight)
    out = fp8(x)
    expected = ref(x.detach())
    assert ((out.float() - expected).abs().max() / expected.abs().max()).item() < 0.1
    out.float().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(fp8.weight.grad).all()
