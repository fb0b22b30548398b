"""Weight-only quantized Linears (``models/quant_linear.py``) and the ``decode_step`` workload.

CPU tests use the "tiny" GPT preset: the workload runs torch on the CPU (the quantized Linears
dequantize and multiply with torch), the Triton path of :class:`QuantLinear` is checked under the
interpreter in fp16. Tests marked ``gpu`` compile the kernels and capture CUDA graphs on a real GPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models.gpt import PRESETS, make_model  # noqa: E402
from models.quant_linear import (  # noqa: E402
    QuantLinear,
    autotune_tiles,
    parameter_bytes,
    quantize_linears,
)
from models.quant_tiles import _candidate_tiles, _compiling, default_tile  # noqa: E402
from objectives.decode_step import DecodeStep  # noqa: E402
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus  # noqa: E402

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
#: Small CPU args: tiny preset (d_model 64, so group 128 is refused), 8 prompt + 8 decoded tokens.
ARGS: dict[str, Any] = {"model": "tiny", "prompt_len": 8, "gen_tokens": 8}
BASE = {"kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": False}


def _cfg(batch: int = 4, bits: int = 16, group: int | None = None, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"batch": batch, "weight_bits": bits, **BASE, **changes}
    if group is not None:
        config["group_size"] = group
    return config


# --------------------------------------------------------------------------- QuantLinear


@pytest.mark.parametrize("bits", [8, 4])
def test_quant_linear_matches_its_dequantized_weight_and_approximates_the_linear(bits: int) -> None:
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(128, 96, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(96, 128, generator=gen))
        linear.bias.copy_(torch.randn(96, generator=gen))
    q = QuantLinear.from_linear(linear, bits, group_size=32)
    assert (q.in_features, q.out_features) == (128, 96) and q.qweight.dtype == torch.int8
    assert q.qweight.shape == (128 * bits // 8, 96) and q.scales.shape == (4, 96)
    x = torch.randn(3, 5, 128, generator=gen)
    y = q(x)
    assert y.shape == (3, 5, 96) and y.dtype == x.dtype
    exact = x.reshape(-1, 128) @ q.dequantized_weight() + q.bias.float()
    torch.testing.assert_close(y.reshape(-1, 96), exact, rtol=1e-2, atol=1e-2)  # bias rounded to bf16
    ref = linear(x).detach()
    rel = float((y - ref).abs().max() / ref.abs().max())
    assert rel < {8: 0.02, 4: 0.25}[bits]
    assert q.weight_bytes < linear.weight.numel() * 2


def test_quant_linear_rejects_bad_arguments() -> None:
    linear = torch.nn.Linear(96, 32, bias=False)
    with pytest.raises(ValueError, match="bits"):
        QuantLinear.from_linear(linear, 3, 32)
    with pytest.raises(ValueError, match="group_size"):
        QuantLinear.from_linear(linear, 4, 64)  # 64 does not divide 96
    q = QuantLinear.from_linear(linear, 8, 32)
    with pytest.raises(ValueError, match="96"):
        q(torch.randn(2, 64))


@pytest.mark.parametrize("bits", [8, 4])
def test_quant_linear_kernel_path_matches_the_torch_fallback(interpreter: None, bits: int) -> None:
    """The Triton path (under the interpreter, fp16) reads the same transposed layout as the fallback."""
    gen = torch.Generator().manual_seed(2)
    linear = torch.nn.Linear(256, 80, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(80, 256, generator=gen))
    x = torch.randn(2, 3, 256, generator=gen).to(torch.float16)
    kernel = QuantLinear.from_linear(linear, bits, 64, scale_dtype=torch.float16, use_kernel=True)
    fallback = QuantLinear.from_linear(linear, bits, 64, scale_dtype=torch.float16, use_kernel=False)
    y_kernel, y_fallback = kernel(x).float(), fallback(x).float()
    assert torch.isfinite(y_kernel).all()
    assert float((y_kernel - y_fallback).abs().max() / y_fallback.abs().max()) < 2e-3


def _packed_layer(in_features: int, out_features: int, seed: int) -> tuple[QuantLinear, torch.Tensor, torch.Tensor]:
    """A packed int4 layer (group 128, fp16 scales) of a seeded Linear, one fp16 row of X, and the fallback's
    product of them in fp32."""
    gen = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
    x = torch.randn(1, in_features, generator=gen).to(torch.float16)
    packed = QuantLinear.from_linear(linear, 4, 128, scale_dtype=torch.float16, use_kernel=True).packed()
    fallback = QuantLinear.from_linear(linear, 4, 128, scale_dtype=torch.float16, use_kernel=False)
    return packed, x, fallback(x).float()


def _compiled_capturing(module: torch.nn.Module) -> tuple[Any, list[Any]]:
    """``module`` through torch.compile (fullgraph), with the traced FX graphs kept (and run as they are)."""
    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    return torch.compile(module, backend=backend, fullgraph=True), graphs


@pytest.mark.timeout(240)
def test_gelu_in_the_packed_epilogue_matches_gelu_after_the_product(interpreter: None) -> None:
    """``activation="gelu_tanh"``: the packed kernel (the interpreter here) applies GELU in its epilogue, eagerly
    and through the opaque operator under torch.compile, as ``F.gelu`` after the fallback's product does; the
    fallback and the tiled kernel apply it after; the MLP's ``fuse_gelu`` takes that path with the same result."""
    from models.gpt import MLP, PRESETS

    packed, x, expected = _packed_layer(256, 64, seed=5)
    want = torch.nn.functional.gelu(expected, approximate="tanh")
    eager = packed(x, activation="gelu_tanh").float()
    compiled, _ = _compiled_capturing(packed)
    assert float((eager - want).abs().max() / want.abs().max()) < 3e-3
    torch.testing.assert_close(compiled(x, activation="gelu_tanh").float(), eager)
    fallback = QuantLinear.from_linear(torch.nn.Linear(256, 64, bias=False), 4, 128, use_kernel=False)
    plain = torch.nn.functional.gelu(fallback(x.bfloat16()), approximate="tanh")
    torch.testing.assert_close(fallback(x.bfloat16(), activation="gelu_tanh"), plain)
    with pytest.raises(ValueError, match="activation must be"):
        packed(x, activation="relu")
    cfg = PRESETS["tiny"]
    mlp = MLP(cfg, lambda i, o, bias: QuantLinear.from_linear(torch.nn.Linear(i, o, bias=bias), 8, 32,
                                                             use_kernel=False))  # fmt: skip
    h = torch.randn(2, 3, cfg.d_model)
    unfused = mlp(h)
    mlp.fuse_gelu = True
    torch.testing.assert_close(mlp(h), unfused)


@pytest.mark.timeout(240)
def test_packed_layer_runs_as_one_opaque_operator_under_torch_compile(interpreter: None) -> None:
    """The packed kernel is reached through ``tuner::packed_linear`` (the interpreter here): eager and compiled
    (fullgraph, so the operator is not traced into) give the fallback's values."""
    packed, x, expected = _packed_layer(256, 64, seed=3)
    compiled, graphs = _compiled_capturing(packed)
    for y in (packed(x).float(), compiled(x).float()):
        assert float((y - expected).abs().max() / expected.abs().max()) < 2e-3
    assert any("tuner.packed_linear" in str(node.target) for gm in graphs for node in gm.graph.nodes)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("store", [1, 2])
def test_partials_tile_leaves_its_sum_to_the_graph(interpreter: None, store: int) -> None:
    """A ``PARTIALS`` tile goes through ``tuner::packed_linear_partials``, whose (SPLIT_K, M, N) partial products (fp32,
    or with ``PARTIALS: 2`` in X's fp16) are summed by an operation of the traced graph (which Inductor fuses into
    the next kernel): eager and compiled give the fallback's values."""
    packed, x, expected = _packed_layer(512, 48, seed=5)
    packed.set_tile(1, {"BLOCK_M": 1, "BLOCK_N": 16, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "PARTIALS": store},
                    device="cpu")  # fmt: skip
    compiled, graphs = _compiled_capturing(packed)
    for y in (packed(x), compiled(x)):
        assert y.dtype == torch.float16 and tuple(y.shape) == (1, 48)
        assert float((y.float() - expected).abs().max() / expected.abs().max()) < 2e-3
    nodes = [node for gm in graphs for node in gm.graph.nodes]
    op = next(node for node in nodes if "tuner.packed_linear_partials" in str(node.target))
    assert any("sum" in str(user.target) for user in op.users)  # the sum is the graph's, not the operator's
    assert op.meta["example_value"].dtype == (torch.float16 if store == 2 else torch.float32)


@pytest.mark.timeout(300)
def test_flash_decode_takes_the_qkv_partials_unsummed(interpreter: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a ``PARTIALS`` tile on a packed qkv, ``flash_decode`` hands the projection's split-K partials to the
    decode kernel as they are (no sum between the two products' kernels, eagerly and as torch.compile traces the
    step): the logits of three steps are those of the step that sums them first, within the rounding of q, k and v
    to bf16."""
    import kernels.attention.decode_attention as decode_attention
    from models.config import GPTConfig
    from models.quant_linear import pack_linears

    cfg = GPTConfig(vocab_size=64, n_layers=1, d_model=256, n_heads=4, seq_len=16)
    base = make_model(cfg, seed=0, device="cpu", dtype=torch.bfloat16, attention="flash_decode")
    model = pack_linears(quantize_linears(base, 4, 128, use_kernel=True))
    qkv = model.blocks[0].attn.qkv
    assert isinstance(qkv, QuantLinear)
    qkv.set_tile(2, {"BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 2, "num_warps": 4, "PREFETCH": 0, "PARTIALS": 1},
                 device="cpu")  # fmt: skip
    launched: list[int] = []
    launch = decode_attention._launch
    monkeypatch.setattr(decode_attention, "_launch", lambda qkv, *args: launched.append(qkv.ndim) or launch(qkv, *args))
    tokens = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(1))

    def logits() -> torch.Tensor:
        cache = model.init_cache(2, 16, torch.bfloat16)
        with torch.no_grad():
            return torch.cat([model.decode(tokens[:, p : p + 1], cache, p) for p in range(3)], dim=1).float()

    unsummed = logits()
    assert launched == [4, 4, 4]  # [P, B, 1, 3 * H * D]: the partials themselves
    # traced as torch.compile traces the step: the partials operator feeds the decode operator, nothing sums them
    torch._dynamo.reset()
    decode, graphs = _compiled_capturing(model.decode)
    cache = model.init_cache(2, 16, torch.bfloat16)
    with torch.no_grad():
        traced = torch.cat([decode(tokens[:, p : p + 1], cache, torch.tensor(p)) for p in range(3)], dim=1)
    torch.testing.assert_close(traced.float(), unsummed)
    nodes = [node for gm in graphs for node in gm.graph.nodes]
    op = next(node for node in nodes if "tuner.packed_linear_partials" in str(node.target))
    assert not any("sum" in str(user.target) for user in op.users), list(op.users)
    assert any("tuner.decode_attention" in str(node.target) for node in nodes)
    launched.clear()
    monkeypatch.setattr(QuantLinear, "partials", lambda self, x: None)
    summed = logits()
    assert launched == [3, 3, 3]
    assert float((unsummed - summed).abs().max() / summed.abs().max()) < 2e-2


def test_partial_candidates_are_split_tiles_left_unsummed() -> None:
    from models.quant_tiles import partial_candidates

    for m in (1, 8, 64):
        tiles = partial_candidates(m, 2048, 2048, 4)
        assert tiles and all(t["PARTIALS"] == 1 and t["SPLIT_K"] > 1 and not t.get("STREAM") for t in tiles)
        assert all(2048 % (t["SPLIT_K"] * 128) == 0 for t in tiles)  # whole int4 spans of 128 rows a split
    assert max(t["SPLIT_K"] for t in partial_candidates(1, 2048, 2048, 4)) == 16  # one span a program
    assert max(t["SPLIT_K"] for t in partial_candidates(1, 2048, 8192, 4)) == 32


def test_partials_tiles_are_tuned_from_32_rows_only() -> None:
    """Below PARTIALS_MIN_ROWS a compiled step's next kernel sums the partials on a few programs (measured slower
    in the 1B step at batches 1 and 8): ``partials`` adds no tile there, and from 32 rows the split-K ones."""
    from models.quant_tiles import partial_candidates, tuned_candidates

    for m in (1, 8, 16, 31):
        assert tuned_candidates(m, 2048, 2048, 4, 128, partials=True) == tuned_candidates(m, 2048, 2048, 4, 128)
    for m in (32, 64):
        tiles = tuned_candidates(m, 2048, 2048, 4, 128, partials=True)
        assert [t for t in tiles if t.get("PARTIALS")] == partial_candidates(m, 2048, 2048, 4) != []
        half = tuned_candidates(m, 2048, 2048, 4, 128, partials=2)  # the same tiles, their partials in X's dtype
        assert [t for t in half if t.get("PARTIALS")] == partial_candidates(m, 2048, 2048, 4, store=2)
        assert [{**t, "PARTIALS": 1} for t in half if t.get("PARTIALS")] == partial_candidates(m, 2048, 2048, 4)
    assert tuned_candidates(8, 2048, 2048, 4, 128, partials=2) == tuned_candidates(8, 2048, 2048, 4, 128)
    with pytest.raises(ValueError, match="partials must be 0"):
        tuned_candidates(64, 2048, 2048, 4, 128, partials=3)


def test_partials_below_32_rows_share_the_tuning_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_packed_tile caches by the tiles it offers: below 32 rows ``partials`` offers the same ones, so the fused
    step reuses the in-kernel step's tile instead of timing them again; from 32 rows it times its own."""
    from models import quant_tiles

    timings: list[int] = []

    def time_tiles(m: int, *args: object) -> list[tuple[dict[str, int], float]]:
        timings.append(m)
        candidates = args[-1]
        assert isinstance(candidates, list)
        return [(candidates[-1], 1.0)]

    monkeypatch.setattr(quant_tiles, "time_packed_tiles", time_tiles)
    monkeypatch.setattr(quant_tiles.torch.cuda, "get_device_name", lambda device=None: "test GPU")
    monkeypatch.setattr(quant_tiles, "_TUNED", {})
    cpu = torch.device("cpu")
    for m in (8, 64):
        kernel = quant_tiles.tune_packed_tile(m, 2048, 2048, 4, 128, torch.bfloat16, cpu)
        fused = quant_tiles.tune_packed_tile(m, 2048, 2048, 4, 128, torch.bfloat16, cpu, partials=True)
        assert (fused == kernel) == (m == 8) and bool(fused.get("PARTIALS")) == (m == 64)
    assert timings == [8, 64, 64]


def test_default_tile_fits_decode_and_prefill_shapes() -> None:
    # One row: the GEMV kernel; split-K only for the 8192-row down projection (128 KB per program unsplit).
    tile = default_tile(1, 2048, 2048, 4, 128, smem_bytes=232448)
    assert tile == {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
    assert default_tile(1, 2048, 8192, 4, 128)["SPLIT_K"] == 2
    assert default_tile(1, 2048, 8192, 8, 128)["SPLIT_K"] == 4
    tile = default_tile(2, 2048, 2048, 4, 128, smem_bytes=232448)
    assert tile == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
    assert default_tile(64, 8192, 2048, 8, 32)["BLOCK_N"] == 32  # 128 tiles of 64 columns < 132: halved
    assert default_tile(64, 16384, 2048, 8, 32)["BLOCK_N"] == 64  # 256 tiles
    big = default_tile(4096, 8192, 8192, 8, 32, smem_bytes=232448)
    assert big["BLOCK_M"] == 64 and big["BLOCK_N"] == 128
    from objectives.quant_gemm import shared_memory_bytes

    small = default_tile(4096, 8192, 8192, 8, 32, smem_bytes=100_000)
    assert shared_memory_bytes({**small, "bits": 8, "group_size": 32}) <= 100_000
    assert small["num_stages"] < big["num_stages"]
    assert default_tile(4, 192, 64, 4, 32)["BLOCK_K"] == 64  # K of the tiny model


def test_autotune_candidates_fit_the_shape_and_cpu_models_are_left_alone() -> None:
    one_row = _candidate_tiles(1, 2048, 2048, 4)
    assert any(t["BLOCK_M"] == 1 for t in one_row) and any(t["BLOCK_M"] == 16 for t in one_row)
    assert all(2048 % (t["SPLIT_K"] * t["BLOCK_K"]) == 0 for t in one_row)
    batch64 = _candidate_tiles(64, 8192, 8192, 8)
    assert {t["BLOCK_M"] for t in batch64} == {16, 64}  # no GEMV past 8 rows
    assert {t["BLOCK_M"] for t in _candidate_tiles(24, 2048, 2048, 8)} == {16, 32}
    # K = 64 (the tiny model): only tiles whose SPLIT_K * BLOCK_K divides it.
    assert all(t["SPLIT_K"] * t["BLOCK_K"] <= 64 for t in _candidate_tiles(4, 192, 64, 8))
    model = quantize_linears(make_model(PRESETS["tiny"], seed=0, device="cpu", dtype=torch.float32), 8, 32)
    assert autotune_tiles(model, 1) == {}
    assert all(not m._tiles for m in model.modules() if isinstance(m, QuantLinear))


def test_quantize_linears_copies_only_the_linears() -> None:
    base = make_model(PRESETS["tiny"], 0, "cpu", torch.bfloat16).requires_grad_(False)
    q = quantize_linears(base, 4, 32)
    linears = [m for m in q.modules() if isinstance(m, torch.nn.Linear)]
    quant = [m for m in q.modules() if isinstance(m, QuantLinear)]
    assert not linears and len(quant) == 4 * PRESETS["tiny"].n_layers
    assert all(isinstance(m, torch.nn.Linear) for m in (base.blocks[0].attn.qkv, base.blocks[1].mlp.proj))
    assert q.tok_emb.weight is base.tok_emb.weight and q.blocks[0].norm1.weight is base.blocks[0].norm1.weight
    assert parameter_bytes(q) < parameter_bytes(base)
    x = torch.randint(0, 256, (2, 8))
    assert torch.isfinite(q(x).float()).all()
    # quantize_decoder: the first blocks in int8, the rest in the asked bit width; only under int4.
    from models.quant_linear import quantize_decoder

    mixed = quantize_decoder(base, 4, 32, int8_first_blocks=1)
    assert [m.bits for m in mixed.blocks[0].modules() if isinstance(m, QuantLinear)] == [8] * 4
    assert [m.bits for m in mixed.blocks[1].modules() if isinstance(m, QuantLinear)] == [4] * 4
    assert parameter_bytes(q) < parameter_bytes(mixed) < parameter_bytes(base)
    with pytest.raises(ValueError, match="int4"):
        quantize_decoder(base, 8, 32, int8_first_blocks=1)


# --------------------------------------------------------------------------- workload: args, space, static


def test_construction_and_static_check_need_no_torch() -> None:
    code = (
        "import sys\n"
        "from objectives.decode_step import DecodeStep\n"
        "from tuner.workloads.base import DeviceInfo\n"
        "w = DecodeStep(model='1b', prompt_len=128, gen_tokens=32)\n"
        "print(w.static_check({'batch': 1, 'weight_bits': 4, 'group_size': 128, 'kv_dtype': 'bf16',"
        " 'attention': 'sdpa', 'cuda_graphs': True}, DeviceInfo(kind='cuda', compute_capability=(9, 0))))\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["None", "[]"]


def test_args_are_validated_naming_the_arg() -> None:
    for bad in (
        {"model": "nope"},
        {"model": {"vocab_size": 10}},
        {"model": {**PRESETS["tiny"].to_dict(), "n_heads": 5}},
        {"prompt_len": 0},
        {"gen_tokens": -1},
        {"prompt_len": 30},  # 30 + 8 > seq_len 32
        {"batch": 0},
        {"seed": "x"},
        {"min_top1_agreement": 1.5},
    ):
        arg = next(iter(bad))
        with pytest.raises(ValueError, match=arg):
            DecodeStep(**{**ARGS, **bad})
    w = DecodeStep(model={**PRESETS["tiny"].to_dict(), "d_ff": 96}, prompt_len=4, gen_tokens=4)
    assert w.cfg.ff == 96 and DecodeStep(**ARGS).cfg == PRESETS["tiny"]


def test_space_seeds_and_the_batch_arg(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.study.space import compile_space

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    knob = DecodeStep(model="1b", prompt_len=128, gen_tokens=32)
    space = compile_space(knob.space_document())
    assert "batch" in space.params and len(space.seeds) == 12
    seeds = [
        (s["weight_bits"], s.get("group_size"), s.get("int8_first_blocks"), s.get("quantizer"), s["compile"],
         s.get("quant_kernel"))
        for s in space.seeds
    ]  # fmt: skip
    measured = [
        (s["attention"], s.get("lm_head_bits"), s.get("fuse_gelu"), s.get("pdl"), s.get("split_sums"))
        for s in space.seeds[1:3]
    ]
    assert measured == [
        ("flash_decode", 8, True, True, "fused16"),  # 16-bit PARTIALS tiles from 32 rows: batch 64's fastest int4
        ("flash_decode", None, None, True, None),
    ]
    assert seeds == [
        (16, None, None, None, "off", None),
        (4, 128, 1, "gptq", "default", "packed"),
        (16, None, None, None, "default", None),
        (4, 128, 1, "gptq", "default", "packed"),
        (4, 128, 1, "gptq", "default", "tiled"),
        (16, None, None, None, "default", None),
        (4, 128, 1, "gptq", "off", "tiled"),
        (4, 128, 0, "gptq", "default", "tiled"),
        (4, 128, 1, "rtn", "off", "tiled"),
        (4, 64, 1, "gptq", "off", "tiled"),
        (4, 32, 0, "gptq", "off", "tiled"),
        (8, 128, None, "rtn", "off", "tiled"),
    ]
    for seed in space.seeds:
        assert space.static_violation(seed, H200.to_dict()) is None and knob.static_check(seed, H200) is None
    fixed = DecodeStep(model="1b", prompt_len=128, gen_tokens=32, batch=8)
    fixed_space = compile_space(fixed.space_document())
    assert "batch" not in fixed_space.params and len(fixed_space.seeds) == 12
    assert all(fixed.static_check(s, H200) is None for s in fixed_space.seeds)
    assert "fixed to 8" in fixed.static_check({**fixed_space.seeds[0], "batch": 4}, H200)
    assert fixed.static_check({**fixed_space.seeds[0], "batch": 8}, H200) is None


def test_static_check_reasons_and_refusals_never_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    w = DecodeStep(**ARGS)
    cases = {
        "cuda_graphs needs a CUDA device": (_cfg(cuda_graphs=True), CPU),
        "does not divide d_model=64": (_cfg(bits=4, group=128), CPU),
        "group_size must be": (_cfg(bits=8), CPU),
        "quantized weights only": (_cfg(bits=16, group=32), CPU),
        "weight_bits must be": (_cfg(bits=2, group=32), CPU),
        "attention='triton'": (_cfg(attention="triton"), CPU),
        "kv_dtype must be": (_cfg(kv_dtype="fp16"), CPU),
        "applies to int4": (_cfg(bits=8, group=32, int8_first_blocks=1), CPU),
        "int8_first_blocks must be an int in [0, 2]": (_cfg(bits=4, group=32, int8_first_blocks=3), CPU),
        "quantizer must be one of": (_cfg(bits=4, group=32, quantizer="awq"), CPU),
        "quantizer applies to quantized weights only": (_cfg(quantizer="gptq"), CPU),
        "compile must be one of ('off', 'default')": (_cfg(compile="max-autotune"), CPU),
        "split_sums must be one of": (_cfg(bits=4, group=32, split_sums="atomic"), CPU),
        "split_sums=fused leaves": (_cfg(bits=4, group=32, compile="default", split_sums="fused"), CPU),
        "split_sums=fused16 leaves": (_cfg(bits=4, group=32, compile="default", split_sums="fused16"), CPU),
        "pdl must be true or false": (_cfg(bits=4, group=32, pdl="yes"), CPU),
        "lm_head_bits must be one of": (_cfg(bits=4, group=32, lm_head_bits=2), CPU),
        "lm_head_bits < 16 quantizes the LM head of a quantized model": (_cfg(lm_head_bits=8), CPU),
        "fuse_gelu must be true or false": (_cfg(bits=4, group=32, fuse_gelu=1), CPU),
        "lm_head_bits=4 with quant_kernel=packed needs d_model=64": (
            _cfg(bits=8, group=32, quant_kernel="packed", lm_head_bits=4), CPU),
        "fuse_gelu applies the MLP's GELU in the packed kernel's epilogue": (_cfg(bits=4, group=32, fuse_gelu=True),
                                                                             CPU),
        "pdl launches the compiled step's kernels": (_cfg(bits=4, group=32, pdl=True), CPU),
        "config lacks batch": ({k: v for k, v in _cfg().items() if k != "batch"}, CPU),
        "compute capability": (_cfg(), DeviceInfo(kind="cuda", name="T4", compute_capability=(7, 5))),
        "GB": (_cfg(batch=64), DeviceInfo(kind="cuda", name="small", total_memory_bytes=10_000)),
    }
    for fragment, (config, device) in cases.items():
        reason = w.static_check(config, device)
        assert reason is not None and fragment in reason, (fragment, reason)
    assert w.static_check(_cfg(cuda_graphs=True), H200) is None
    model = {"vocab_size": 512, "n_layers": 2, "d_model": 256, "n_heads": 4, "seq_len": 64}
    wide = DecodeStep(**{**ARGS, "model": model})  # packed int4 needs rows of whole 128-wide spans
    pdl = _cfg(bits=4, group=128, compile="default", quant_kernel="packed", pdl=True)
    assert wide.static_check(pdl, CPU) is None and wide.static_check(pdl, H200) is None
    gelu = _cfg(bits=4, group=128, quant_kernel="packed", fuse_gelu=True)
    assert wide.static_check(gelu, CPU) is None
    runs = [wide.run(config, CPU, TrialContext()) for config in (gelu, {**gelu, "fuse_gelu": False})]
    assert all(r.status == TrialStatus.OK for r in runs), [r.error for r in runs]
    # on the CPU the layers take the fallback, which applies the GELU after the product: the same logits
    assert runs[0].metrics["max_logit_error"] == runs[1].metrics["max_logit_error"]
    a100 = DeviceInfo(kind="cuda", name="A100", compute_capability=(8, 0))
    assert "pdl (programmatic dependent launch) needs compute capability >= 9.0" in (wide.static_check(pdl, a100) or "")

    def must_not_launch(*args: Any) -> None:
        raise AssertionError("launched a statically infeasible config")

    monkeypatch.setattr(w, "_launch", must_not_launch)
    monkeypatch.setattr(w, "_get_case", must_not_launch)
    result = w.run(_cfg(cuda_graphs=True), CPU, TrialContext())
    assert result.status == TrialStatus.INFEASIBLE_STATIC and "CUDA device" in (result.error or "")


def test_work_exports_and_registry() -> None:
    from tuner.workloads.registry import workload_class

    w = DecodeStep(**ARGS)
    config = _cfg(bits=4, group=32, kv_dtype="fp8_e4m3", attention="math")
    flops, moved, precision = w.work(config)
    cfg = PRESETS["tiny"]
    n = cfg.n_params(embedding=False) + cfg.vocab_size * cfg.d_model
    assert precision == "bf16" and flops > 4 * 8 * 2 * n  # 4 sequences x 8 tokens x 2N, plus attention
    bf16_moved = w.work(_cfg())[1]
    assert 0 < moved < bf16_moved
    exported = w.export_config(config)
    assert json.loads(json.dumps(exported))["kv_cache_dtype"] == "torch.float8_e4m3fn"
    compile(w.export_python(config), "<export>", "exec")
    compile(w.export_python(_cfg()), "<export>", "exec")
    gptq = w.export_python({**config, "quantizer": "gptq"})
    compile(gptq, "<export>", "exec")
    assert "gptq_decoder(model, bits=4, group_size=32, calibration=calibration" in gptq
    assert "quantize_decoder(model" not in gptq and "quantize_decoder(model" in w.export_python(config)
    assert w.export_config(config)["quantizer"] == "rtn" and w.export_config(_cfg())["quantizer"] is None
    assert all(isinstance(v, str) for v in w.export_env(config).values())
    assert w.export_config(config)["compile"] == "off" and "decode = model.decode" in w.export_python(config)
    compiled = w.export_python({**config, "compile": "default"})
    compile(compiled, "<export>", "exec")
    assert "decode = torch.compile(model.decode, mode='default', dynamic=False)" in compiled
    assert "partials" not in compiled and w.export_config(config)["split_sums"] == "kernel"
    fused = {**config, "compile": "default", "quant_kernel": "packed", "split_sums": "fused"}
    assert "autotune_tiles(model, m=4, partials=True)" in w.export_python(fused)
    fused16 = w.export_python({**fused, "split_sums": "fused16"})  # the partials in the activations' dtype
    compile(fused16, "<export>", "exec")
    assert "autotune_tiles(model, m=4, partials=2)" in fused16
    assert w.work({**config, "lm_head_bits": 8})[1] < moved  # the head's bytes: int8 and scales, not bf16
    head = w.export_python({**fused, "lm_head_bits": 8})
    compile(head, "<export>", "exec")
    assert "model = quantize_head(model, bits=8, group_size=32)" in head
    assert "quantize_head" not in w.export_python(fused)
    assert "model = pack_linears(model)" in head and "pack_linears" not in w.export_python(config)
    assert w.export_config(fused)["lm_head_bits"] == 16 and w.export_config(fused)["fuse_gelu"] is False
    gelu = w.export_python({**fused, "fuse_gelu": True})
    compile(gelu, "<export>", "exec")
    assert "    block.mlp.fuse_gelu = True" in gelu and "fuse_gelu" not in w.export_python(fused)
    flash_pdl = w.export_python({**fused, "pdl": True, "attention": "flash_decode"})
    compile(flash_pdl, "<export>", "exec")
    assert "    block.attn.decode_pdl = True" in flash_pdl
    assert "decode_pdl" not in w.export_python({**fused, "pdl": True})
    assert w.export_config({**fused, "lm_head_bits": 4})["lm_head_bits"] == 4
    pdl = w.export_python({**fused, "pdl": True})
    compile(pdl, "<export>", "exec")
    assert "autotune_tiles(model, m=4, partials=True, pdl=True)" in pdl and w.export_config(fused)["pdl"] is False
    assert "options = {**torch._inductor.list_mode_options('default'), 'triton.enable_pdl': True}" in pdl
    assert "decode = torch.compile(model.decode, dynamic=False, options=options)" in pdl
    assert workload_class("decode_step") is DecodeStep


# --------------------------------------------------------------------------- workload: runs on the CPU


@pytest.fixture(scope="module")
def workload() -> DecodeStep:
    """One workload for the CPU runs: models and references are cached across tests, as in a worker."""
    return DecodeStep(**ARGS)


def test_flagged_variants_are_copies_sharing_every_tensor(workload: DecodeStep) -> None:
    """``fuse_gelu`` and the decode attention's PDL are set on a copy of the variant (bf16 too), never on the
    model other configs share; the copy holds the same tensors, not copies of them."""
    models = workload.models
    base = models.base("flash_decode", "cpu")
    flagged, _ = models.variant("flash_decode", 16, None, "cpu", attention_pdl=True)
    assert flagged is not base and all(block.attn.decode_pdl for block in flagged.blocks)
    assert not any(block.attn.decode_pdl for block in base.blocks)
    assert models.variant("flash_decode", 16, None, "cpu")[0] is base
    plain, _ = models.variant("flash_decode", 8, 32, "cpu")
    fused, _ = models.variant("flash_decode", 8, 32, "cpu", fuse_gelu=True)
    assert all(block.mlp.fuse_gelu for block in fused.blocks) and not any(b.mlp.fuse_gelu for b in plain.blocks)
    for a, b in ((flagged, base), (fused, plain)):
        pointers = [t.data_ptr() for t in [*a.parameters(), *a.buffers()]]
        assert pointers == [t.data_ptr() for t in [*b.parameters(), *b.buffers()]]


def test_reference_decode_matches_the_full_forward_pass(workload: DecodeStep) -> None:
    """The bf16 reference (prefill + cached greedy steps) against independent full forwards."""
    ref = workload.models.reference(3, "cpu")
    model = workload.models.base("sdpa", "cpu")
    seq = torch.cat([ref.prompt, ref.teacher.t()], dim=1)  # prompt + every decode input
    with torch.no_grad():
        full = model(seq).float()
    prompt_len = ARGS["prompt_len"]
    for t in range(ARGS["gen_tokens"]):
        torch.testing.assert_close(ref.logits[t], full[:, prompt_len + t], atol=0.03, rtol=0.03)
        if t + 1 < ARGS["gen_tokens"]:  # greedy: the next input is this step's argmax
            assert torch.equal(ref.teacher[t + 1], ref.logits[t].argmax(-1))


def test_run_bf16_is_exactly_the_reference(workload: DecodeStep) -> None:
    result = workload.run(_cfg(), CPU, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.metrics["max_logit_error"] == 0 and result.metrics["top1_agreement"] == 1.0
    for metric in workload.metric_specs():
        assert math.isfinite(result.metrics[metric.name]), metric.name
    assert result.samples_ms and all(s > 0 for s in result.samples_ms) and result.timing_comparable is False
    tokens = 4 * ARGS["gen_tokens"]
    assert result.metrics["tokens_per_s"] == pytest.approx(tokens / (result.metrics["ms_per_token"] * 8e-3))
    cfg = PRESETS["tiny"]
    kv = 2 * cfg.n_layers * 4 * 16 * cfg.d_model * 2
    assert result.metrics["peak_mem_gb"] * 1e9 == pytest.approx(2 * cfg.n_params() + kv)
    stats = workload.reference_tokens(4, CPU)
    assert stats["tokens"] == tokens and 1 <= stats["distinct"] <= tokens
    assert len(stats["first_sequence"]) == ARGS["gen_tokens"]
    assert 1 <= stats["distinct_per_sequence_mean"] <= ARGS["gen_tokens"]
    margins = stats["top1_margin_logits"]
    assert 0 <= margins["p05"] <= margins["p25"] <= margins["median"] and 0 <= margins["below_0.1"] <= 1
    assert 0 <= margins["tied"] <= margins["below_0.1"]
    ref = workload.models.reference(4, "cpu").logits.sort(dim=-1, descending=True).values
    assert margins["median"] == pytest.approx(float((ref[..., 0] - ref[..., 1]).median()), abs=0.05)


def test_quantized_weights_and_fp8_cache_trade_accuracy(workload: DecodeStep) -> None:
    results = {
        name: workload.run(config, CPU, TrialContext())
        for name, config in {
            "int8": _cfg(bits=8, group=32),
            "int4": _cfg(bits=4, group=64, attention="math"),
            "fp8kv": _cfg(kv_dtype="fp8_e4m3"),
            "math": _cfg(attention="math"),
        }.items()
    }
    for name, result in results.items():
        assert result.status == TrialStatus.OK, (name, result.error)
    m = {name: r.metrics for name, r in results.items()}
    assert m["int8"]["top1_agreement"] >= 0.95 and 0 < m["int8"]["max_logit_error"] < 0.05
    head = workload.run(_cfg(bits=8, group=32, lm_head_bits=8), CPU, TrialContext())
    assert head.status == TrialStatus.OK, head.error
    assert head.metrics["top1_agreement"] >= 0.95 and head.metrics["max_logit_error"] < 0.1
    assert head.metrics["max_logit_error"] != m["int8"]["max_logit_error"]  # the head's own rounding shows
    assert m["int4"]["top1_agreement"] >= 0.5  # reported; lower than int8 on this model
    assert m["int4"]["mean_logit_error"] > 3 * m["int8"]["mean_logit_error"]
    assert m["int4"]["peak_mem_gb"] < m["int8"]["peak_mem_gb"] < results["math"].metrics["peak_mem_gb"]
    assert 0 < m["fp8kv"]["max_logit_error"] < 0.05 and m["fp8kv"]["top1_agreement"] >= 0.95
    assert results["fp8kv"].extra["kv_cache_bytes"] * 2 == results["math"].extra["kv_cache_bytes"]
    assert m["math"]["max_logit_error"] < 0.05


@pytest.mark.timeout(300)
def test_flash_decode_attention_matches_sdpa_with_bf16_and_fp8_caches(
    workload: DecodeStep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attention: flash_decode`` (the Triton decode kernel, under the interpreter here): with a bf16 cache the
    same logits as SDPA's step up to rounding, with an fp8 cache the same agreement as SDPA's fp8 path; and the
    static rules refuse it on a CPU without the interpreter and for a head_dim the kernel cannot take."""
    runs = {name: workload.run(config, CPU, TrialContext()) for name, config in {
        "sdpa": _cfg(), "flash": _cfg(attention="flash_decode"),
        "sdpa_fp8": _cfg(kv_dtype="fp8_e4m3"), "flash_fp8": _cfg(attention="flash_decode", kv_dtype="fp8_e4m3"),
    }.items()}  # fmt: skip
    for name, result in runs.items():
        assert result.status == TrialStatus.OK, (name, result.error)
    m = {name: r.metrics for name, r in runs.items()}
    assert m["flash"]["top1_agreement"] >= 0.95 and m["flash"]["max_logit_error"] < 0.05
    assert m["flash"]["mean_logit_error"] < 2 * m["sdpa"]["mean_logit_error"] + 1e-3
    assert m["flash_fp8"]["top1_agreement"] >= 0.95 and 0 < m["flash_fp8"]["max_logit_error"] < 0.05
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "only under the interpreter" in (workload.static_check(_cfg(attention="flash_decode"), CPU) or "")
    assert workload.static_check(_cfg(attention="flash_decode"), H200) is None
    odd = DecodeStep(**{**ARGS, "model": {"vocab_size": 256, "n_layers": 2, "d_model": 96, "n_heads": 4,
                                          "seq_len": 32}})  # fmt: skip
    assert "power of two" in (odd.static_check(_cfg(attention="flash_decode"), H200) or "")


@pytest.mark.timeout(300)
def test_compiled_decode_matches_eager_and_is_one_graph(workload: DecodeStep) -> None:
    """``compile: default`` runs the step through torch.compile (inductor, here its CPU backend): the same
    logits as the eager step up to fused-kernel rounding, every step through one compiled graph."""
    from torch._dynamo.utils import counters

    eager = workload.run(_cfg(bits=8, group=32), CPU, TrialContext())
    counters.clear()
    compiled = workload.run(_cfg(bits=8, group=32, compile="default"), CPU, TrialContext())
    assert compiled.status == TrialStatus.OK, compiled.error
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    (case,) = [c for key, c in workload._cases.items() if key[-1] == "default"]
    assert case.decode._torchdynamo_orig_callable == case.model.decode
    for metric in ("top1_agreement", "max_logit_error", "mean_logit_error"):
        assert compiled.metrics[metric] == pytest.approx(eager.metrics[metric], abs=0.02), metric
    assert compiled.metrics["peak_mem_gb"] == eager.metrics["peak_mem_gb"]
    # the decode attention kernel (an operator that writes the cache) compiles into the same single graph
    counters.clear()
    flash = workload.run(_cfg(bits=8, group=32, compile="default", attention="flash_decode"), CPU, TrialContext())
    assert flash.status == TrialStatus.OK, flash.error
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert flash.metrics["max_logit_error"] == pytest.approx(eager.metrics["max_logit_error"], abs=0.02)


def test_pdl_compiles_the_step_with_inductors_programmatic_dependent_launch() -> None:
    """``pdl``: torch.compile gets the mode's Inductor options plus ``triton.enable_pdl`` (a mode and options
    cannot both be given); without it, the mode alone. A function compiled so runs (here on Inductor's CPU
    backend, which has no launches to make dependent) and gives the eager result."""
    from objectives.decode_step import compile_decode, compile_options

    assert compile_options("default", False) == {"mode": "default"}
    assert compile_options("default", True) == {"options": {"triton.enable_pdl": True}}
    assert compile_options("reduce-overhead", True)["options"]["triton.cudagraphs"] is True
    x = torch.randn(64)
    assert torch.allclose(compile_decode(lambda t: torch.relu(t) * 2 + 1, "default", True)(x), torch.relu(x) * 2 + 1)


@pytest.mark.timeout(300)
def test_pretraining_gives_margins_that_int4_keeps_and_is_cached_on_disk(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 4096-token model: random, int4 flips argmaxes; trained 50 steps (loss 8.4 -> ~3), it agrees fully."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    model = {"vocab_size": 4096, "n_layers": 4, "d_model": 256, "n_heads": 4, "seq_len": 256}
    args = {"model": model, "prompt_len": 32, "gen_tokens": 32, "min_top1_agreement": 0.0}
    int4 = _cfg(bits=4, group=128)
    random = DecodeStep(**args).run(int4, CPU, TrialContext())
    trained = DecodeStep(**args, train_steps=50)
    result = trained.run(int4, CPU, TrialContext())
    assert random.status == result.status == TrialStatus.OK
    losses = trained.pretrain_losses
    assert len(losses) == 50 and losses[-1] < losses[0] - 3
    assert random.metrics["top1_agreement"] < 0.95 <= result.metrics["top1_agreement"]
    # A second workload (another process: a study's worker) loads the same weights instead of training.
    (cached,) = (tmp_path / "pretrained").iterdir()
    again = DecodeStep(**args, train_steps=50)
    monkeypatch.setattr("models.gpt.pretrain", lambda *a, **k: pytest.fail("trained again"))
    repeat = again.run(int4, CPU, TrialContext()).metrics
    for metric in ("top1_agreement", "max_logit_error", "mean_logit_error"):
        assert repeat[metric] == result.metrics[metric], metric
    assert again.pretrain_losses == losses and cached.exists()
    # Block 0 in int8: its Linears are int8, the others int4; closer to the bf16 model.
    first_int8 = trained.run({**int4, "int8_first_blocks": 1}, CPU, TrialContext())
    model, _ = trained.models.variant("sdpa", 4, 128, "cpu", 1)
    bits = {name: m.bits for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert {b for n, b in bits.items() if n.startswith("blocks.0.")} == {8}
    assert {b for n, b in bits.items() if not n.startswith("blocks.0.")} == {4}
    assert first_int8.metrics["mean_logit_error"] < result.metrics["mean_logit_error"]
    assert first_int8.metrics["peak_mem_gb"] > result.metrics["peak_mem_gb"]
    # GPTQ: the same format and bytes, closer to the bf16 model; its layers are kept on disk too.
    gptq = trained.run({**int4, "quantizer": "gptq"}, CPU, TrialContext())
    assert gptq.status == TrialStatus.OK and gptq.metrics["peak_mem_gb"] == result.metrics["peak_mem_gb"]
    assert gptq.metrics["mean_logit_error"] < 0.9 * result.metrics["mean_logit_error"]
    (stored,) = (tmp_path / "gptq").iterdir()
    monkeypatch.setattr("models.gptq.gptq_layers", lambda *a, **k: pytest.fail("quantized again"))
    loaded = again.run({**int4, "quantizer": "gptq"}, CPU, TrialContext()).metrics
    assert loaded["mean_logit_error"] == gptq.metrics["mean_logit_error"] and stored.exists()


def test_gptq_weights_are_prepared_ahead_of_the_trials_that_use_them(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    config = _cfg(bits=4, group=32, quantizer="gptq", int8_first_blocks=1)
    assert DecodeStep(**ARGS).prepare_weights(_cfg(bits=4, group=32), CPU) == 0.0  # round-to-nearest: nothing
    assert not (tmp_path / "gptq").exists()
    assert DecodeStep(**ARGS).prepare_weights(config, CPU) > 0.0
    monkeypatch.setattr("models.gptq.gptq_layers", lambda *a, **k: pytest.fail("quantized in the trial"))
    result = DecodeStep(**ARGS).run(config, CPU, TrialContext())
    assert result.status == TrialStatus.OK and result.metrics["top1_agreement"] > 0.5


def test_a_decode_that_writes_nothing_or_disagrees_is_numerics_fail(
    workload: DecodeStep, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(workload, "_launch", lambda config, case: None)
        result = workload.run(_cfg(), CPU, TrialContext())
    assert result.status == TrialStatus.NUMERICS_FAIL and "NaN" in (result.error or "")
    strict = DecodeStep(**ARGS, min_top1_agreement=1.0)
    result = strict.run(_cfg(bits=4, group=64, attention="math"), CPU, TrialContext())
    assert result.status == TrialStatus.NUMERICS_FAIL and "top1_agreement" in (result.error or "")
    assert result.metrics["top1_agreement"] < 1.0


def test_cases_are_kept_for_four_configs_and_freed_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.decode_step import MAX_CASES

    w = DecodeStep(**ARGS)
    configs = [_cfg(), _cfg(attention="math"), _cfg(kv_dtype="fp8_e4m3"), _cfg(bits=8, group=32), _cfg(batch=2)]
    cases = [w._get_case(config, CPU) for config in configs]
    assert MAX_CASES == 4 and len(w._cases) == 4 and cases[0].key not in w._cases
    assert w._get_case(configs[1], CPU) is cases[1]  # kept: not rebuilt (nor recompiled)
    # On a GPU, the oldest go first when the free memory is under twice what the new case allocates.
    needed = w._case_bytes(configs[0])
    assert needed == w.kv_bytes(configs[0]) + 4 * 8 * 4 * PRESETS["tiny"].vocab_size
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2 * needed + 1, 10**12))
    w._make_room(configs[0], H200)
    assert len(w._cases) == 3  # the count bound alone
    free = iter([0, 0, 2 * needed])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (next(free), 10**12))
    w._make_room(configs[0], H200)
    assert list(w._cases) == [cases[1].key]  # two more freed, the most recently used kept


def test_top1_agreement_counts_a_token_the_reference_ties_for_first() -> None:
    """Reference logits of 2 steps x 2 sequences: at (0, 0) tokens 1 and 3 tie for first. A decode that
    takes 3 there agrees (the reference's argmax took 1, the lowest index); taking 2 anywhere does not."""
    from types import SimpleNamespace

    from objectives.decode_step import _Reference

    w = DecodeStep(**{**ARGS, "gen_tokens": 2})
    logits = torch.tensor([[[0.0, 2.0, 1.0, 2.0], [3.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 5.0, 1.0], [0.0, 1.0, 0.0, 0.5]]])
    ref = _Reference(prompt=None, teacher=None, logits=logits, top1=logits.argmax(-1))
    assert ref.top1[0, 0] == 1

    def agreement(chosen: list[list[int]]) -> dict[str, Any]:
        out = torch.full_like(logits, -1.0)
        for t, row in enumerate(chosen):
            for b, token in enumerate(row):
                out[t, b, token] = 10.0
        return w._logit_errors(SimpleNamespace(out=out, ref=ref, batch=2))

    tied = agreement([[3, 0], [2, 1]])
    assert tied["top1_agreement"] == 1.0 and tied["top1_same_index"] == 0.75
    wrong = agreement([[2, 0], [2, 1]])
    assert wrong["top1_agreement"] == 0.75 and wrong["top1_same_index"] == 0.75


def test_compile_failures_become_statuses(workload: DecodeStep, monkeypatch: pytest.MonkeyPatch) -> None:
    class OutOfResources(Exception):
        pass

    def fail(config: Any, case: Any) -> None:
        raise OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448")

    monkeypatch.setattr(workload, "_launch", fail)
    result = workload.run(_cfg(), CPU, TrialContext())
    assert result.status == TrialStatus.OUT_OF_RESOURCES and "OutOfResources" in (result.error or "")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_engine_study_on_cpu(sqlite_url: str) -> None:
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    db = StudyDB(sqlite_url)
    spec = {
        "name": "decode-cpu",
        "workload": "decode_step",
        "args": {**ARGS, "batch": 2},
        "space": {"group_size": {"choices": [32, 64]}},
        "objectives": [{"metric": "tokens_per_s"}, {"metric": "top1_agreement"}],
        "constraints": ["top1_agreement >= 0.8"],
        "budget": {"trials": 6, "trial_timeout_s": 120},
        "seed": 3,
        "warm_start": False,
    }
    summary = Orchestrator(load_spec(spec), db, workers=1).run()
    trials = db.trials(summary.study_id)
    measured = [t for t in trials if t.status != "infeasible_static" and t.duplicate_of is None]
    assert summary.status == "completed" and len(measured) == 6
    assert all(t.status == "ok" for t in measured), [(t.status, t.error) for t in measured]
    assert all(not t.params["cuda_graphs"] and "batch" not in t.params for t in measured)
    pruned = [t.error or "" for t in trials if t.status == "infeasible_static"]
    assert all("CUDA device" in e for e in pruned), pruned
    for t in measured:
        assert t.metrics["tokens_per_s"] > 0 and 0.5 <= t.metrics["top1_agreement"] <= 1.0
        assert t.timing_comparable is False
    db.dispose()


# --------------------------------------------------------------------------- on a GPU


def gpu_test(fn):
    """GPU-only: compiled kernels (not the interpreter) on a CUDA device (checked by ``_cuda``)."""
    for mark in (
        pytest.mark.gpu,
        pytest.mark.timeout(600),
        pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter"),
    ):
        fn = mark(fn)
    return fn


def _cuda() -> DeviceInfo:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuner.workloads.fingerprint import device_info

    return device_info()


@gpu_test
@pytest.mark.parametrize("bits", [8, 4])
def test_quant_linear_kernel_on_gpu(bits: int) -> None:
    _cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    linear = torch.nn.Linear(2048, 6144, bias=False, device="cuda")
    with torch.no_grad():
        linear.weight.normal_(0, 0.02, generator=gen)
    q = QuantLinear.from_linear(linear, bits, 128)
    fallback = QuantLinear.from_linear(linear, bits, 128, use_kernel=False)
    for m in (1, 8, 64, 1024):
        x = torch.randn(m, 2048, device="cuda", generator=gen).to(torch.bfloat16)
        y, y_ref = q(x).float(), fallback(x).float()
        assert float((y - y_ref).abs().max() / y_ref.abs().max()) < 1e-2, m


@gpu_test
def test_autotuned_tiles_are_correct_and_no_slower_than_the_heuristic() -> None:
    device = _cuda()
    from models.quant_tiles import tune_tile
    from tuner.workloads.measure import time_fn

    gen = torch.Generator(device="cuda").manual_seed(0)
    linear = torch.nn.Linear(2048, 6144, bias=False, device="cuda")
    with torch.no_grad():
        linear.weight.normal_(0, 0.02, generator=gen)
    q = QuantLinear.from_linear(linear, 4, 128)
    fallback = QuantLinear.from_linear(linear, 4, 128, use_kernel=False)
    for m in (1, 8):
        chosen = autotune_tiles(torch.nn.Sequential(q), m)
        assert chosen[(2048, 6144)] == q._tiles[(m, "cuda:0")]
        x = torch.randn(m, 2048, device="cuda", generator=gen).to(torch.bfloat16)
        y, y_ref = q(x).float(), fallback(x).float()
        assert float((y - y_ref).abs().max() / y_ref.abs().max()) < 1e-2, m
    tuned = tune_tile(1, 6144, 2048, 4, 128, torch.bfloat16, torch.device("cuda"))
    heuristic = default_tile(1, 6144, 2048, 4, 128)
    # Both timed here the same way (CUDA graph of 64 products over rotating weights): the tuned tile
    # was the fastest of a set that the heuristic's neighbours belong to; allow 10% for noise.
    from kernels.quant.quant_gemm import quant_matmul

    x = torch.randn(1, 2048, device="cuda").to(torch.bfloat16)
    weights = [QuantLinear.from_linear(linear, 4, 128) for _ in range(16)]  # 100 MB: more than L2
    medians = {}
    for name, tile in {"tuned": tuned, "heuristic": heuristic}.items():
        medians[name] = time_fn(
            lambda tile=tile: [quant_matmul(x, w.qweight, w.scales, bits=4, group_size=128, **tile) for w in weights],
            device,
            cuda_graph=True,
            graph_calls=1,
            flush_l2=False,
        ).median_ms
    print(tuned, heuristic, medians)
    assert medians["tuned"] <= medians["heuristic"] * 1.1


@gpu_test
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_on_gpu_graphs_match_eager_and_quantization_is_faster(batch: int) -> None:
    device = _cuda()
    # Trained first (see models.gpt.pretrain): a random model's argmax flips under any quantization.
    w = DecodeStep(model="125m", prompt_len=64, gen_tokens=16, batch=batch, train_steps=150)
    results = {}
    for name, config in {
        "bf16": {"weight_bits": 16, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": False},
        "bf16-graphs": {"weight_bits": 16, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": True},
        "int4-graphs": {
            "weight_bits": 4,
            "group_size": 128,
            "kv_dtype": "bf16",
            "attention": "sdpa",
            "cuda_graphs": True,
        },
        "bf16-graphs-compiled": {
            "weight_bits": 16,
            "kv_dtype": "bf16",
            "attention": "sdpa",
            "cuda_graphs": True,
            "compile": "default",
        },
        "int4-graphs-compiled": {
            "weight_bits": 4,
            "group_size": 128,
            "kv_dtype": "bf16",
            "attention": "sdpa",
            "cuda_graphs": True,
            "compile": "default",
        },
        "int4-gptq-graphs": {
            "weight_bits": 4,
            "group_size": 128,
            "quantizer": "gptq",
            "kv_dtype": "bf16",
            "attention": "sdpa",
            "cuda_graphs": True,
        },
        "int8-fp8kv-math": {
            "weight_bits": 8,
            "group_size": 64,
            "kv_dtype": "fp8_e4m3",
            "attention": "math",
            "cuda_graphs": True,
        },
    }.items():
        assert w.static_check(config, device) is None
        result = w.run(config, device, TrialContext())
        assert result.status == TrialStatus.OK, (name, result.error)
        assert result.timing_comparable and len(result.samples_ms) >= 10
        results[name] = result.metrics
        print(name, {k: round(v, 4) for k, v in result.metrics.items()})
    # Same kernels as the reference (graphs replay them): equal up to cuBLAS choosing another algorithm.
    for name in ("bf16", "bf16-graphs"):
        assert results[name]["max_logit_error"] < 0.05 and results[name]["top1_agreement"] >= 0.99, name
    assert results["bf16-graphs"]["tokens_per_s"] > results["bf16"]["tokens_per_s"]
    # Compiled (fused kernels, then the same graph capture): the logits of the eager step up to rounding.
    # (one bf16 rounding step of a logit near 16 is 0.125)
    assert results["bf16-graphs-compiled"]["max_logit_error"] <= 0.25
    assert results["bf16-graphs-compiled"]["mean_logit_error"] < 0.02
    assert results["bf16-graphs-compiled"]["top1_agreement"] >= 0.98
    for metric in ("top1_agreement", "mean_logit_error"):
        compiled, eager = results["int4-graphs-compiled"][metric], results["int4-graphs"][metric]
        assert compiled == pytest.approx(eager, abs=0.02), metric
    assert results["int4-graphs"]["peak_mem_gb"] < results["bf16-graphs"]["peak_mem_gb"]
    assert results["int8-fp8kv-math"]["top1_agreement"] >= 0.95
    assert results["int4-graphs"]["top1_agreement"] >= 0.9
    assert results["int4-gptq-graphs"]["mean_logit_error"] < results["int4-graphs"]["mean_logit_error"]
    assert results["int4-gptq-graphs"]["peak_mem_gb"] == pytest.approx(results["int4-graphs"]["peak_mem_gb"], rel=0.01)


@gpu_test
def test_decode_on_gpu_split_sums_at_64_rows_keep_the_in_kernel_sums_logits() -> None:
    """At 64 rows (where ``PARTIALS`` tiles are offered) the compiled, graphed flash_decode step with split-K's sums
    left to the next operation in fp32 (``fused``) or 16 bits (``fused16``; the qkv partials summed by the decode
    kernel) runs and agrees with the step that sums them in the kernel, up to bf16 rounding."""
    device = _cuda()
    w = DecodeStep(model="125m", prompt_len=64, gen_tokens=8, batch=64, train_steps=150)
    base = {"weight_bits": 4, "group_size": 128, "quant_kernel": "packed", "kv_dtype": "bf16",
            "attention": "flash_decode", "cuda_graphs": True, "compile": "default"}  # fmt: skip
    results = {}
    for sums in ("kernel", "fused", "fused16"):
        config = {**base, "split_sums": sums}
        assert w.static_check(config, device) is None
        result = w.run(config, device, TrialContext())
        assert result.status == TrialStatus.OK, (sums, result.error)
        results[sums] = result.metrics
        print(sums, {k: round(v, 4) for k, v in result.metrics.items()})
    for sums in ("fused", "fused16"):
        for metric in ("top1_agreement", "mean_logit_error"):
            assert results[sums][metric] == pytest.approx(results["kernel"][metric], abs=0.02), (sums, metric)


def test_tuners_keep_only_the_tiles_that_compile_in_their_order() -> None:
    """Both tile tuners filter their candidates through one thread-pooled compile: a tile whose compile raises
    (any error: a compile failure, shared memory) is dropped, the others keep their order."""
    tiles = [{"BLOCK_N": bn} for bn in (16, 32, 64, 128, 256)]

    def compile_tile(tile: dict[str, int]) -> None:
        if tile["BLOCK_N"] in (32, 256):
            raise RuntimeError("out of resources")

    assert _compiling(tiles, compile_tile) == [{"BLOCK_N": 16}, {"BLOCK_N": 64}, {"BLOCK_N": 128}]
    assert _compiling([], compile_tile) == []
