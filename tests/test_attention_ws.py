"""The warp-specialized Gluon attention kernel (``kernels/attention/attention_ws.py``), the ``gluon_ws`` variant of
``flash_attention``.

The Triton interpreter does not run Gluon, so on the CPU the kernel is compiled ahead of time for sm_90 in a
child process (wgmma, TMA loads, the partitions' register budgets, shared memory against the static check's
estimate) and the workload's static checks and exports are checked; on a GPU its trials are checked for
numerics at two shapes, ragged edges included, with the log-sum-exp the backward reads.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest
from conftest import compiled_gpu

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
B200 = DeviceInfo(kind="cuda", name="NVIDIA B200", compute_capability=(10, 0), smem_per_block_bytes=232448)


def _config(block_n: int = 128, stages: int = 3, overlap: bool = True, persistent: bool = False,
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"BLOCK_M": 128, "BLOCK_N": block_n, "num_warps": 4, "num_stages": stages, "precision": "bf16",
            "kernel": "gluon_ws", "OVERLAP": overlap, "PERSISTENT": persistent, **extra}  # fmt: skip


@pytest.mark.timeout(60)
def test_static_check_names_what_the_gluon_kernel_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(batch=2, heads=16, seq_len=4096, head_dim=128, causal=True)
    assert "interpreter" in (workload.static_check(_config(), CPU) or "")
    # Import Triton (through the kernel module) while the interpreter is still on: the first import decides
    # whether kernels interpret for the rest of the process, and later tests here need the interpreter.
    import kernels.attention.attention_ws  # noqa: F401

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "compute capability 9.x" in (workload.static_check(_config(), B200) or "")
    assert "BLOCK_M=128" in (workload.static_check({**_config(), "BLOCK_M": 64}, H200) or "")
    assert "num_warps=4" in (workload.static_check({**_config(), "num_warps": 8}, H200) or "")
    assert "SPLIT_M" in (workload.static_check(_config(SPLIT_M=True), H200) or "")
    assert "BLOCK_N" in (workload.static_check(_config(block_n=256), H200) or "")
    assert "OVERLAP" in (workload.static_check(_config(overlap="yes"), H200) or "")
    assert "PERSISTENT" in (workload.static_check(_config(persistent=1), H200) or "")
    assert "needs OVERLAP" in (workload.static_check(_config(overlap=False, PINGPONG=True), H200) or "")
    assert "shared memory" in (workload.static_check(_config(stages=4), H200) or "")
    assert "must be 2 or 3" in (workload.static_check(_config(CONSUMERS=4), H200) or "")
    assert "ONE_LOOP must be true or false" in (workload.static_check(_config(ONE_LOOP=1), H200) or "")
    assert "head_dim 64 only" in (workload.static_check(_config(CONSUMERS=3), H200) or "")
    chained = _config(persistent=True, ONE_LOOP=True, CHAIN=True)
    assert workload.static_check(chained, H200) is None
    assert "got ONE_LOOP=false" in (workload.static_check({**chained, "ONE_LOOP": False}, H200) or "")
    assert "got PINGPONG=true" in (workload.static_check({**chained, "PINGPONG": True}, H200) or "")
    assert "CHAIN must be true or false" in (workload.static_check({**chained, "CHAIN": "on"}, H200) or "")
    narrow = FlashAttention(batch=2, heads=16, seq_len=4096, head_dim=64, causal=True)
    assert narrow.static_check(_config(CONSUMERS=3), H200) is None
    assert "EPILOGUE" in (workload.static_check(_config(EPILOGUE=3), H200) or "")
    assert "RELEASE_K must be true or false" in (workload.static_check(_config(RELEASE_K=2), H200) or "")
    assert workload.static_check(_config(stages=2, RELEASE_K=True), H200) is None
    assert workload.static_check(_config(persistent=True, ONE_LOOP=True, HALF_DIAG=True), H200) is None
    assert "HALF_DIAG must be true or false" in (workload.static_check(_config(HALF_DIAG=1), H200) or "")
    for wrong in ({"overlap": False}, {"PINGPONG": True}, {"block_n": 64}):
        reason = workload.static_check(_config(**{**wrong, "HALF_DIAG": True}), H200) or ""
        assert "HALF_DIAG gives the first consumer" in reason, (wrong, reason)
    assert "CONSUMERS=3" in (narrow.static_check(_config(CONSUMERS=3, HALF_DIAG=True), H200) or "")
    assert narrow.static_check(_config(stages=2, EXP_POLY=3), H200) is None
    for wrong in (5, -1, True, 1.5):
        assert "EXP_POLY" in (workload.static_check(_config(EXP_POLY=wrong), H200) or ""), wrong
    for epilogue in (1, 2):  # the conversion's scratch beside three K/V stages fits at D=64, not at D=128
        assert "epilogue scratch" in (workload.static_check(_config(EPILOGUE=epilogue), H200) or "")
        assert workload.static_check(_config(stages=2, EPILOGUE=epilogue), H200) is None
        assert narrow.static_check(_config(CONSUMERS=3, EPILOGUE=epilogue), H200) is None
    assert workload.static_check(_config(), H200) is None


@pytest.mark.timeout(60)
def test_the_space_proposes_only_the_kernels_fixed_tile() -> None:
    from tuner.study.space import compile_space, load_space_file

    space = compile_space(load_space_file("attention.yaml"))
    assert "gluon_ws" in space.params["kernel"].choices
    assert space.static_violation(_config(), H200.to_dict()) is None
    assert space.static_violation({**_config(), "BLOCK_M": 256}, H200.to_dict()) is not None
    assert space.static_violation({**_config(), "num_warps": 8}, H200.to_dict()) is not None
    assert any(seed.get("kernel") == "gluon_ws" for seed in space.seeds)


@pytest.mark.timeout(60)
def test_python_export_names_the_kernel_function_and_its_arguments() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(batch=4, heads=16, seq_len=8192, head_dim=128, causal=True)
    exported = workload.export_config(_config(persistent=True))
    assert exported["function"] == "kernels.attention.attention_ws.attention_ws"
    assert exported["kwargs"] == {"BLOCK_N": 128, "NUM_BUFFERS": 3, "OVERLAP": True, "PERSISTENT": True,
                                  "PINGPONG": False, "CONSUMERS": 2, "ONE_LOOP": False, "CHAIN": False,
                                  "EPILOGUE": 0, "RELEASE_K": False, "HALF_DIAG": False, "EXP_POLY": 0,
                                  "SUM_MMA": False, "STREAM_KV": False, "Q_BUFFERS": 1, "LPT_HEADS": 0}  # fmt: skip
    assert workload.export_config(_config(persistent=True, EXP_POLY=2))["kwargs"]["EXP_POLY"] == 2
    assert workload.export_config(_config(persistent=True, LPT_HEADS=64))["kwargs"]["LPT_HEADS"] == 64
    assert workload.export_config(_config(persistent=True, SUM_MMA=True))["kwargs"]["SUM_MMA"] is True
    source = workload.export_python(_config(persistent=True))
    tree = ast.parse(source)
    namespace: dict[str, Any] = {}
    exec(compile(tree, "<export>", "exec"), namespace)  # the import line and the config dict run as pasted
    assert namespace["ATTENTION_CONFIG"] == exported["kwargs"]
    assert callable(namespace["attention_ws"])
    assert "attention_ws(q, k, v, causal=True, **ATTENTION_CONFIG)" in source


_AOT_SCRIPT = """
import json, re, sys
from kernels.attention import attention_ws
if not attention_ws.available():
    print(json.dumps({"skip": "this Triton has no Gluon Hopper API"}))
    sys.exit(0)
for job in json.loads(sys.argv[1]):
    kernel = compile_or_skip(lambda: attention_ws.compile_for_target(*job["shape"], precision="bf16", **job["config"]))
    ptx = kernel.asm["ptx"]
    budgets = re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)
    print(json.dumps({**job, "shared": kernel.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                      "tma": "cp.async.bulk.tensor" in ptx, "setmaxnreg": sorted(set(int(n) for n in budgets)),
                      "stores": {"v4": ptx.count("st.global.v4"), "b32": ptx.count("st.global.b32")},
                      "arrives": ptx.count("mbarrier.arrive"),
                      "warpgroup_barriers": len(re.findall(r"bar\\.sync\\s+\\d+, 128;", ptx)),
                      "thread_arrives": ptx.count("cp.async.mbarrier.arrive.noinc"),
                      "scores_64_keys": len(re.findall(r"mma_async\\.\\S+\\.m64n64k16\\.\\S+ \\{[^}]*\\}, %rd", ptx)),
                      "row_sum_wgmmas": ptx.count("m64n8k16"), "fp32_adds": len(re.findall(r"\\badd\\.f32\\b", ptx)),
                      "warp_arrives": ptx.count("mov.u32 l, %laneid; setp.eq.u32 p, l, 0;"),
                      "flag_releases": ptx.count("release.exch"), "flag_acquires": ptx.count("acquire.gpu.cas"),
                      "global_loads": len(re.findall(r"\\bld\\.global", ptx))}),
          flush=True)
"""


@pytest.mark.timeout(300)
def test_kernel_compiles_for_sm90_with_wgmma_tma_and_partition_registers(aot_child: Any) -> None:
    """Causal and full, D 64 and 128, with and without the overlap, one program per tile and persistent: wgmma
    and TMA in the PTX, the loader's 24-register budget carved out, shared memory within the static check's
    estimate."""
    from kernels.attention.attention_ws_rules import check_config, consumer_regs_limit

    variants = ((128, True, True, False, 2, False), (128, False, False, True, 2, False),
                (64, True, False, True, 2, True), (64, False, True, False, 2, False), (128, True, True, True, 2, True),
                (64, True, True, True, 3, True), (64, False, False, False, 3, False))  # fmt: skip
    jobs = []
    for d, c, o, p, consumers, one_loop in variants:
        config = {"causal": c, "BLOCK_N": 128, "NUM_BUFFERS": 3 if d == 128 else 2, "OVERLAP": o, "PERSISTENT": p,
                  "PINGPONG": o and p, "CONSUMERS": consumers, "ONE_LOOP": one_loop}  # fmt: skip
        jobs.append({"shape": [2, 16, 2048, d], "config": config})
    for d, c in ((128, True), (64, False)):  # one consumer, two programs an SM
        config = {"causal": c, "BLOCK_N": 64 if d == 128 else 128, "NUM_BUFFERS": 2, "OVERLAP": True,
                  "PERSISTENT": True, "PINGPONG": False, "CONSUMERS": 1, "CTAS_PER_SM": 2,
                  "ONE_LOOP": True}  # fmt: skip
        jobs.append({"shape": [2, 16, 2048, d], "config": config})
    for d, c, consumers in ((128, True, 2), (64, False, 3)):  # CHAIN: a persistent program's tiles chained
        config = {"causal": c, "BLOCK_N": 128, "NUM_BUFFERS": 3 if d == 128 else 2, "OVERLAP": True,
                  "PERSISTENT": True, "PINGPONG": False, "CONSUMERS": consumers, "ONE_LOOP": True,
                  "CHAIN": True}  # fmt: skip
        jobs.append({"shape": [2, 16, 2048, d], "config": config})
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for result in lines:
        config, head_dim = result["config"], result["shape"][3]
        assert result["wgmma"] > 0 and result["tma"], result
        assert 24 in result["setmaxnreg"], result  # the loader warp's budget
        consumers, ctas = config["CONSUMERS"], config.get("CTAS_PER_SM", 1)
        assert consumer_regs_limit(consumers, ctas) in result["setmaxnreg"], result  # what the loader frees
        assert check_config(head_dim, config["BLOCK_N"], config["NUM_BUFFERS"], "bf16", consumers, ctas) is None
        rows = 64 * consumers
        estimate = 2 * (rows * head_dim + 2 * config["NUM_BUFFERS"] * config["BLOCK_N"] * head_dim) + 1024
        assert estimate - 1024 <= result["shared"] <= estimate, (result, estimate)


@pytest.mark.timeout(300)
def test_early_k_release_compiles_with_its_own_empty_barriers(aot_child: Any) -> None:
    """``RELEASE_K`` (sm_90 PTX, no GPU): one more empty barrier a stage (8 bytes of shared memory each) and more
    arrivals, in the plain, overlapped, ping-pong and chained consumer loops."""
    jobs = []
    for extra in ({}, {"OVERLAP": True}, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True},
                  {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CHAIN": True}):  # fmt: skip
        for release in (False, True):
            config = {"causal": True, "BLOCK_N": 128, "NUM_BUFFERS": 2, "RELEASE_K": release, **extra}
            jobs.append({"shape": [2, 16, 1024, 128], "config": config})
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for held, released in zip(lines[::2], lines[1::2], strict=True):
        assert released["shared"] == held["shared"] + 8 * 2, (held, released)
        assert released["arrives"] > held["arrives"], (held, released)
        assert released["wgmma"] == held["wgmma"] and released["tma"], released


@pytest.mark.timeout(300)
def test_row_sums_by_wgmma_replace_the_threads_adds(aot_child: Any) -> None:
    """``SUM_MMA`` (sm_90 PTX, no GPU): a 64 x 8 wgmma of P against the ones beside every P V (``BLOCK_N`` / 16 a key
    block), far fewer fp32 adds (the threads no longer sum P), 2 KiB of ones and a barrier more shared memory, in the
    plain, overlapped, ping-pong and persistent one-loop consumers."""
    loops = ((64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2}),
             (128, {"OVERLAP": True, "PINGPONG": True}), (128, {"OVERLAP": False}))  # fmt: skip
    for off, on in _without_and_with(aot_child, "SUM_MMA", loops):
        assert off["row_sum_wgmmas"] == 0 and on["row_sum_wgmmas"] > 0, on
        assert on["row_sum_wgmmas"] % (128 // 16) == 0, on  # a whole key block's K steps at a time
        assert on["wgmma"] == off["wgmma"] + on["row_sum_wgmmas"], (off, on)
        assert on["fp32_adds"] < off["fp32_adds"] / 4, (off["fp32_adds"], on["fp32_adds"])
        assert 2 * 8 * 128 + 8 <= on["shared"] - off["shared"] <= 2 * 8 * 128 + 8 + 1024, (off, on)


#: Consumer loops the arrival-mode PTX tests compile (head dim, knobs): overlapped, ping-pong with the quad epilogue,
#: chained, three consumers, and one consumer with two programs an SM.
_ARRIVE_LOOPS = ((128, {"OVERLAP": True}),
                 (128, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True, "EPILOGUE": 2}),
                 (128, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CHAIN": True}),
                 (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 3}),
                 (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 1, "CTAS_PER_SM": 2,
                       "RELEASE_K": False}))  # fmt: skip


def _without_and_with(aot_child: Any, knob: str, loops: tuple) -> list[tuple[dict, dict]]:
    """sm_90 compiles of each loop of ``loops`` (causal, S = 1024, RELEASE_K unless the loop says otherwise)
    without and with ``knob``, as (without, with) pairs of the AOT script's records."""
    jobs = [{"shape": [2, 16, 1024, d], "config": {"causal": True, "BLOCK_N": 128, "NUM_BUFFERS": 2,
                                                   "RELEASE_K": True, **extra, knob: on}}
            for d, extra in loops for on in (False, True)]  # fmt: skip
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    return list(zip(lines[::2], lines[1::2], strict=True))


@pytest.mark.timeout(300)
def test_half_diagonal_adds_a_64_key_step_for_the_first_consumer_only_when_causal(aot_child: Any) -> None:
    """``HALF_DIAG`` (sm_90 PTX, no GPU): causal, the first consumer's diagonal block is a step of its own on the
    first 64 keys: scores of 64 x 64 from shared memory (Q and the K slot's first half: K / 16 wgmmas, none
    without the knob), one program per tile and persistent, D = 64 and 128, in the same shared memory; without the
    causal mask the kernel is the same as without the knob."""
    jobs = []
    for d, extra in ((64, {"PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2, "RELEASE_K": True}),
                     (128, {"PERSISTENT": True, "ONE_LOOP": True, "RELEASE_K": True}), (128, {})):  # fmt: skip
        for causal in (True, False):
            for on in (False, True):
                config = {"causal": causal, "BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, **extra, "HALF_DIAG": on}
                jobs.append({"shape": [2, 16, 1024, d], "config": config})
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for i in range(0, len(lines), 4):
        causal_off, causal_on, full_off, full_on = lines[i : i + 4]
        d = causal_on["shape"][3]
        assert causal_off["scores_64_keys"] == 0 and causal_on["scores_64_keys"] == d // 16, causal_on
        assert causal_on["shared"] == causal_off["shared"], (causal_off, causal_on)
        assert full_on["wgmma"] == full_off["wgmma"] and full_on["scores_64_keys"] == 0, full_on


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64), (1, 2, 200, 64)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
def test_gpu_half_diagonal_matches_fp32_attention(shape: tuple[int, int, int, int]) -> None:
    """``HALF_DIAG`` (causal: the first consumer takes the first 64 keys of the diagonal block alone): outputs
    (NaN-filled first) and log-sum-exp against fp32 math, one program per tile and persistent, one loop or two,
    K released early or not, two and three stages, at ragged lengths (a last tile partly past the end; S = 200
    has tiles whose first consumer has no block before the diagonal)."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, True, shape[2] + 17)
    persistent = {"PERSISTENT": True, "ONE_LOOP": True}
    variants = [{}, {"ONE_LOOP": True}, persistent, {**persistent, "RELEASE_K": True, "EPILOGUE": 2},
                {**persistent, "NUM_BUFFERS": 3}, {"PERSISTENT": True, "RELEASE_K": True}]
    base = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True}
    for knobs in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, True, **{**base, **knobs, "HALF_DIAG": True})


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_row_sums_by_wgmma_match_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``SUM_MMA`` (each row's sum of P by a 64 x 8 wgmma against a block of ones, not by the threads): outputs and
    log-sum-exp against fp32 math in every loop the sums pass through: plain, overlapped, ping-pong, persistent with
    one loop (two and, at D = 64, three stages) and, causal, ``HALF_DIAG``'s half block (summed by the threads)."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 17)
    persistent = {"PERSISTENT": True, "ONE_LOOP": True, "RELEASE_K": True, "EPILOGUE": 2}
    variants = [{"OVERLAP": False}, {}, {"PINGPONG": True}, persistent]
    if shape[3] == 64:  # three stages beside the ones fit at D = 64 only
        variants.append({**persistent, "NUM_BUFFERS": 3})
    if causal:
        variants.append({**persistent, "HALF_DIAG": True})
    base = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True}
    for knobs in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal, **{**base, **knobs, "SUM_MMA": True})


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64), (3, 5, 777, 64)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_streamed_last_round_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``STREAM_KV`` (the persistent grid's last round dealt out by key blocks, a tile's parts merged by the program
    holding its first blocks): outputs and log-sum-exp against fp32 math. The shapes leave a partial last round on
    any 132-SM GPU: 1000 and 777 rows (ragged tiles) put fewer key blocks than programs in the round, so tiles are
    cut into one-block parts over many programs, some shares empty; (2, 16, 1024) cuts tiles in two or three. Two
    consumers (with and without ping-pong and SUM_MMA, two and three stages), and at D = 64 three consumers and one
    consumer with two programs an SM (64-key blocks). Each config runs twice: a launch must leave its flags reset."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 29)
    base = {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "RELEASE_K": True, "STREAM_KV": True}
    variants = [{"BLOCK_N": 128, "NUM_BUFFERS": 2, "EPILOGUE": 2}, {"BLOCK_N": 64, "NUM_BUFFERS": 2, "PINGPONG": True},
                {"BLOCK_N": 128, "NUM_BUFFERS": 2, "EPILOGUE": 2, "SUM_MMA": True}]  # fmt: skip
    if shape[3] == 64:
        variants += [{"BLOCK_N": 128, "NUM_BUFFERS": 3}, {"BLOCK_N": 64, "NUM_BUFFERS": 2, "CONSUMERS": 3},
                     {"BLOCK_N": 64, "NUM_BUFFERS": 2, "CONSUMERS": 1, "CTAS_PER_SM": 2}]  # fmt: skip
    _assert_variants_match_fp32(q, k, v, expected, expected_lse, causal, base, variants, launches=2)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64), (3, 5, 777, 64)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_longest_first_schedule_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``LPT_HEADS`` (each persistent program's tiles from a table, longest first by groups of heads): outputs and
    log-sum-exp against fp32 math, ragged (1000, 777 rows) and even, groups of 16 heads (two groups of the 32, or
    one larger than the 3 or 15 heads) and of 128, in the persistent loops: one loop with the vector epilogue,
    ping-pong, two Q buffers with three stages, ``HALF_DIAG``, ``SUM_MMA``, and at D = 64 three consumers and one
    consumer with two programs an SM. Each config runs twice (the table is cached)."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 37)
    base = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True,
            "RELEASE_K": True, "LPT_HEADS": 16}  # fmt: skip
    variants = [{"EPILOGUE": 2}, {"EPILOGUE": 2, "LPT_HEADS": 128}, {"PINGPONG": True, "EPILOGUE": 2},
                {"SUM_MMA": True}, {"Q_BUFFERS": 2}]  # fmt: skip
    if causal:
        variants.append({"HALF_DIAG": True, "EPILOGUE": 2})
    if shape[3] == 64:
        variants += [{"NUM_BUFFERS": 3, "EPILOGUE": 2, "Q_BUFFERS": 2}, {"CONSUMERS": 3, "BLOCK_N": 64},
                     {"CONSUMERS": 1, "CTAS_PER_SM": 2, "BLOCK_N": 64}]  # fmt: skip
    _assert_variants_match_fp32(q, k, v, expected, expected_lse, causal, base, variants, launches=2)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_double_buffered_q_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``Q_BUFFERS=2`` (each consumer's tiles alternate between two Q buffers, so the loader fetches the next tile's
    Q while this one runs): outputs and log-sum-exp against fp32 math in the persistent loops it changes: one loop
    with the vector epilogue, ping-pong, ``SUM_MMA``, ``STREAM_KV`` and, causal, ``HALF_DIAG``; at D = 64 three
    stages (with and without the vector epilogue) and three consumers. Every program runs several tiles at these
    shapes, so both buffers and both phases of each are used."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 31)
    base = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True,
            "RELEASE_K": True, "Q_BUFFERS": 2}  # fmt: skip
    variants = [{"EPILOGUE": 2}, {"PINGPONG": True, "EPILOGUE": 2}, {"SUM_MMA": True}, {"STREAM_KV": True}]
    if causal:
        variants.append({"HALF_DIAG": True, "EPILOGUE": 2})
    if shape[3] == 64:
        variants += [{"NUM_BUFFERS": 3}, {"NUM_BUFFERS": 3, "EPILOGUE": 2}, {"CONSUMERS": 3, "BLOCK_N": 64}]
    _assert_variants_match_fp32(q, k, v, expected, expected_lse, causal, base, variants)


def _assert_variants_match_fp32(q: Any, k: Any, v: Any, expected: Any, expected_lse: Any, causal: bool, base: dict,
                                variants: list[dict], launches: int = 1) -> None:  # fmt: skip
    """:func:`_assert_matches_fp32` for ``base`` with each of ``variants`` over it, ``launches`` times each; every
    failing launch is reported (with :func:`_where_wrong`'s rows), not just the first."""
    failures = []
    for knobs in variants:
        for launch in range(launches):
            try:
                _assert_matches_fp32(q, k, v, expected, expected_lse, causal, **{**base, **knobs})
            except AssertionError as exc:
                failures.append(f"{knobs} launch {launch}: {_where_wrong(q, k, v, expected, causal, base, knobs)}"
                                f" ({str(exc)[-200:]})")  # fmt: skip
    assert not failures, "\n".join(failures)


def _where_wrong(q: Any, k: Any, v: Any, expected: Any, causal: bool, base: dict, knobs: dict) -> str:
    """Which rows of a failing launch are unwritten (NaN) or wrong: counts, and the first few (batch*head, row)."""
    import torch

    from kernels.attention.attention_ws import attention_ws

    out = torch.full_like(q, float("nan"))
    attention_ws(q, k, v, causal=causal, out=out, **{**base, **knobs})
    rows = out.float().flatten(0, 1)
    nan = rows.isnan().any(-1).nonzero().tolist()
    wrong = ((rows - expected.flatten(0, 1)).abs().amax(-1) > 1e-2 * expected.abs().max()).nonzero().tolist()
    return f"{len(nan)} NaN rows {nan[:6]}, {len(wrong)} wrong rows {wrong[:6]}"


def _run_exp2_ptx(asm: str, x: Any) -> Any:
    """Run the straight-line PTX of :func:`kernels.attention.attention_ws_steps.exp2_asm` on fp32 arrays, one lane per
    value, ``x`` split round-robin over its ``EXP_PACK`` inputs; returns the outputs in ``x``'s order. Registers
    hold raw 32-bit words; each fp32 operation rounds to fp32 (an FMA through fp64, where a float32 product is
    exact); ``ex2.approx`` is taken as exact (the hardware's error, 2^-22, is not what is checked here)."""
    import re

    import numpy as np

    from kernels.attention.attention_ws_steps import EXP_PACK

    lanes = x.reshape(-1, EXP_PACK).astype(np.float32)
    regs: dict[str, Any] = {f"${EXP_PACK + i}": lanes[:, i].view(np.uint32) for i in range(EXP_PACK)}

    def value(operand: str) -> Any:
        if operand.startswith("0f"):
            return np.full(len(lanes), int(operand[2:], 16), dtype=np.uint32)
        if re.fullmatch(r"\d+", operand):
            return int(operand)
        return regs[operand]

    def f32(word: Any) -> Any:
        return word.view(np.float32).astype(np.float64)

    def word(value: Any) -> Any:
        return value.astype(np.float32).view(np.uint32)

    for statement in asm.replace("{", ";").replace("}", ";").split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        op, rest = statement.split(None, 1)
        dest, *args = [a.strip() for a in rest.split(",")]
        a = [value(arg) for arg in args]
        if op == "ex2.approx.ftz.f32":
            regs[dest] = word(np.exp2(f32(a[0])))
        elif op == "max.ftz.f32":
            regs[dest] = word(np.maximum(f32(a[0]), f32(a[1])))
        elif op == "add.rn.ftz.f32":
            regs[dest] = word(f32(a[0]) + f32(a[1]))
        elif op == "sub.rn.ftz.f32":
            regs[dest] = word(f32(a[0]) - f32(a[1]))
        elif op == "fma.rn.ftz.f32":
            regs[dest] = word(f32(a[0]) * f32(a[1]) + f32(a[2]))
        elif op == "mov.b32":
            regs[dest] = a[0].copy()
        elif op == "shl.b32":
            regs[dest] = (a[0] << np.uint32(a[1])).astype(np.uint32)
        elif op == "add.s32":
            regs[dest] = (a[0] + a[1]).astype(np.uint32)
        else:
            raise AssertionError(f"an instruction this check does not model: {statement}")
    return np.stack([regs[f"${i}"].view(np.float32) for i in range(EXP_PACK)], axis=1).reshape(x.shape)


@pytest.mark.timeout(60)
def test_polynomial_exponential_ptx_matches_exp2_and_keeps_masked_scores_tiny() -> None:
    """``EXP_POLY``'s PTX, run value by value on the CPU: for every split (0-4 of 8 on the polynomial) the outputs
    are 2^x to within 1e-4 relative over [-125, 0] (and at the integers, where f = 0, and the half-integers, where
    the rounding of j turns), masked scores (-1e30 after the max) come out finite, positive and below 2^-124, and
    the polynomial takes the last ``poly`` of every 8 values, the exponential unit the rest."""
    import numpy as np

    from kernels.attention.attention_ws_rules import EXP_POLY_CHOICES
    from kernels.attention.attention_ws_steps import exp2_asm

    x = np.concatenate([np.linspace(-125.0, 0.0, 200_000), -np.arange(126.0), -np.arange(125.0) - 0.5,
                        np.array([-1e-7, -0.25, -0.75])]).astype(np.float32)  # fmt: skip
    x = np.resize(x, (len(x) + 7) // 8 * 8)
    exact = np.exp2(x.astype(np.float64))
    for poly in EXP_POLY_CHOICES:
        asm = exp2_asm(poly)
        assert asm.count("ex2.approx.ftz.f32") == 8 - poly and asm.count("fma.rn.ftz.f32 p, p, f") == 2 * poly, poly
        got = _run_exp2_ptx(asm, x).astype(np.float64)
        assert np.max(np.abs(got / exact - 1)) < 1e-4, (poly, np.max(np.abs(got / exact - 1)))
        masked = _run_exp2_ptx(asm, np.full(64, -1e30, dtype=np.float32)).reshape(8, 8)
        assert np.all(masked[:, : 8 - poly] == 0.0), poly  # the unit flushes to zero
        assert np.all((masked[:, 8 - poly :] > 0) & (masked[:, 8 - poly :] < 2.0**-124)), (poly, masked)


_EXP_SCRIPT = """
import json, re, sys
from kernels.attention import attention_ws
if not attention_ws.available():
    print(json.dumps({"skip": "this Triton has no Gluon Hopper API"}))
    sys.exit(0)
for job in json.loads(sys.argv[1]):
    kernel = compile_or_skip(lambda: attention_ws.compile_for_target(*job["shape"], precision="bf16", **job["config"]))
    sass = sass_or_skip(kernel)
    ptx = kernel.asm["ptx"]
    print(json.dumps({**job, "shared": kernel.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                      "ex2_ptx": ptx.count("ex2.approx.ftz.f32"), "poly_ptx": ptx.count("fma.rn.ftz.f32 p, f,"),
                      "mufu_ex2": sass.count("MUFU.EX2"), "spills": len(re.findall(r"\\b(?:STL|LDL)\\b", sass))}),
          flush=True)
"""


@pytest.mark.timeout(300)
def test_polynomial_exponentials_move_scores_off_the_multi_function_unit(aot_child: Any) -> None:
    """``EXP_POLY`` (sm_90 PTX and SASS, no GPU): with 2 and 4 of every 8 scores on the polynomial, each
    polynomial in the PTX replaces one ``ex2`` and one ``MUFU.EX2`` in the SASS (the rescale's exponentials stay on
    the unit), with the same wgmmas and shared memory and no spills: the winners' loops at D = 64 and 128,
    ping-pong, chained tiles, three consumers and ``HALF_DIAG``."""
    loops = ((64, True, {"PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2, "RELEASE_K": True}),
             (64, False, {"PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 3, "NUM_BUFFERS": 3, "EPILOGUE": 2}),
             (128, True, {"PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True, "RELEASE_K": True}),
             (128, False, {"PERSISTENT": True, "ONE_LOOP": True, "CHAIN": True}),
             (64, True, {"PERSISTENT": True, "ONE_LOOP": True, "RELEASE_K": True, "HALF_DIAG": True}))  # fmt: skip
    jobs = [{"shape": [2, 16, 1024, d], "config": {"causal": causal, "BLOCK_N": 128, "NUM_BUFFERS": 2,
                                                   "OVERLAP": True, **extra, "EXP_POLY": poly}}
            for d, causal, extra in loops for poly in (0, 2, 4)]  # fmt: skip
    lines = aot_child(_EXP_SCRIPT, json.dumps(jobs), timeout=290)
    assert len(lines) == len(jobs), lines
    for i in range(0, len(lines), 3):
        plain, quarter, half = lines[i : i + 3]
        assert plain["poly_ptx"] == 0 and quarter["poly_ptx"] > 0 and half["poly_ptx"] == 2 * quarter["poly_ptx"]
        for split in (quarter, half):  # to within one: the compiler folds one of HALF_DIAG's plain exponentials
            assert abs(split["ex2_ptx"] + split["poly_ptx"] - plain["ex2_ptx"]) <= 1, (plain, split)
            assert abs(split["mufu_ex2"] + split["poly_ptx"] - plain["mufu_ex2"]) <= 1, (plain, split)
            assert split["wgmma"] == plain["wgmma"] and split["shared"] == plain["shared"], split
        assert plain["spills"] == quarter["spills"] == half["spills"] == 0, (plain, quarter, half)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_polynomial_exponentials_match_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``EXP_POLY`` 1-4 (part of every 8 scores' exponentials by the polynomial): outputs (NaN-filled first) and
    log-sum-exp against fp32 math with the plain, overlapped, ping-pong and chained loops, three consumers at
    D = 64 and ``HALF_DIAG`` when causal, at a ragged length (S = 1000: masked keys past the end)."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 19)
    persistent = {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True, "RELEASE_K": True}
    variants = [({}, 2), ({"OVERLAP": True}, 1), ({**persistent, "EPILOGUE": 2}, 3),
                ({**persistent, "PINGPONG": True}, 4), ({**persistent, "CHAIN": True}, 2)]  # fmt: skip
    if shape[3] == 64:
        variants.append(({**persistent, "CONSUMERS": 3, "NUM_BUFFERS": 3}, 2))
    if causal:
        variants.append(({**persistent, "HALF_DIAG": True}, 2))
    for knobs, poly in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal,
                             **{"BLOCK_N": 128, "NUM_BUFFERS": 2, **knobs, "EXP_POLY": poly})  # fmt: skip


@pytest.mark.timeout(300)
def test_thread_arrive_drops_warpgroup_barriers_around_the_slot_releases(aot_child: Any) -> None:
    """``THREAD_ARRIVE`` (sm_90 PTX, no GPU): every consumer thread frees a K/V slot with its own
    ``cp.async.mbarrier.arrive.noinc``, so the warpgroup barriers Triton puts around a one-thread arrival go (no
    more ``bar.sync N, 128`` in any consumer loop: plain, overlapped, ping-pong, chained, three consumers, one
    consumer two programs an SM; fewer over all), with the same wgmmas and shared memory."""
    pairs = _without_and_with(aot_child, "THREAD_ARRIVE", ((128, {}), *_ARRIVE_LOOPS))
    for one, every in pairs:
        assert one["thread_arrives"] == 0 and every["thread_arrives"] > 0, (one, every)
        assert every["warpgroup_barriers"] <= one["warpgroup_barriers"], (one, every)
        assert every["wgmma"] == one["wgmma"] and every["shared"] == one["shared"], (one, every)
    # Triton 3.6 brackets each one-thread arrival (fewer barriers in every loop); 3.9 drops some itself (the
    # overlapped loops still lose theirs)
    assert sum(every["warpgroup_barriers"] for _, every in pairs) < sum(one["warpgroup_barriers"] for one, _ in pairs)


@pytest.mark.timeout(300)
def test_warp_arrive_frees_slots_in_inline_ptx_at_the_barriers_offset(aot_child: Any) -> None:
    """``WARP_ARRIVE`` (sm_90 PTX, no GPU): lane 0 of each consumer warp frees a K/V slot in inline PTX at
    kv_empty's shared-memory offset, read from a first compile's barrier inits (4 arrivals a consumer); Triton
    brackets none of them, so every consumer loop has fewer warpgroup barriers than with one thread's arrival,
    with the same wgmmas and shared memory."""
    for one, warps in _without_and_with(aot_child, "WARP_ARRIVE", _ARRIVE_LOOPS):
        assert one["warp_arrives"] == 0 and warps["warp_arrives"] > 0, (one, warps)
        assert warps["warpgroup_barriers"] < one["warpgroup_barriers"], (one, warps)
        assert warps["wgmma"] == one["wgmma"] and warps["shared"] == one["shared"], (one, warps)


def test_empty_barrier_offsets_read_from_ptx() -> None:
    """The offsets WARP_ARRIVE's inline PTX uses: the barriers initialized with the given count, in order, each
    address formed from ``global_smem`` plus an immediate; none when the PTX has no such base."""
    from kernels.attention.attention_ws import _check
    from kernels.attention.attention_ws_steps import empty_barrier_offsets

    ptx = """
        mov.b32 	%r9, global_smem;
        add.s32 	%r10, %r9, 86048;
        @%p1 mbarrier.init.shared::cta.b64 [%r10], 1;
        add.s32 	%r11, %r9, 86016;
        @%p1 mbarrier.init.shared::cta.b64 [%r11], 8;
        add.s32 	%r12, %r9, 86024;
        @%p1 mbarrier.init.shared::cta.b64 [%r12], 8;
    """
    assert empty_barrier_offsets(ptx, 8) == [86016, 86024]
    assert empty_barrier_offsets(ptx, 1) == [86048]
    assert empty_barrier_offsets(ptx.replace("global_smem", "other"), 8) == []
    with pytest.raises(ValueError, match="set one of them"):
        _check(64, "bf16", {"THREAD_ARRIVE": True, "WARP_ARRIVE": True})


@pytest.mark.timeout(300)
def test_vector_epilogue_stores_16_byte_rows_within_the_checked_shared_memory(aot_child: Any) -> None:
    """``EPILOGUE`` 1 and 2 (sm_90 PTX, no GPU): every output store a 16-byte vector (none of the accumulator
    layout's 4-byte pieces), with and without the persistent grid, chained tiles and three consumers; their shared
    memory within :func:`check_config`'s bounds (2 well under 1's), which refuse the stage count they no longer
    fit."""
    from kernels.attention.attention_ws_rules import EPILOGUE_SHUFFLE_SCRATCH, check_config

    jobs = []
    for d, consumers, extra in ((128, 2, {}), (128, 2, {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True}),
                                (64, 3, {}), (128, 2, {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True,
                                                       "CHAIN": True})):  # fmt: skip
        for epilogue in (0, 1, 2):
            config = {"causal": True, "BLOCK_N": 128, "NUM_BUFFERS": 2, "CONSUMERS": consumers, "EPILOGUE": epilogue,
                      **extra}  # fmt: skip
            jobs.append({"shape": [2, 16, 1024, d], "config": config})
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for plain, vector, quad in zip(lines[::3], lines[1::3], lines[2::3], strict=True):
        assert plain["stores"]["b32"] > 0 and plain["stores"]["v4"] == 0, plain
        for stored in (vector, quad):
            assert stored["stores"]["v4"] > 0 and stored["stores"]["b32"] == 0, stored
        assert vector["shared"] > quad["shared"] > plain["shared"], (plain, vector, quad)  # the scratch
        consumers, head_dim = vector["config"]["CONSUMERS"], vector["shape"][3]
        assert quad["shared"] - plain["shared"] <= EPILOGUE_SHUFFLE_SCRATCH * consumers, (plain, quad)
        bound = 2 * (64 * consumers * head_dim + 2 * 2 * 128 * head_dim) + 1024 + 2 * 64 * consumers * head_dim
        assert check_config(head_dim, 128, 2, "bf16", consumers, 1, 1) is None and vector["shared"] <= bound
    assert check_config(128, 128, 3, "bf16", 2, 1, 0) is None
    assert "epilogue scratch" in (check_config(128, 128, 3, "bf16", 2, 1, 1) or "")
    assert "epilogue scratch" in (check_config(128, 128, 3, "bf16", 2, 1, 2) or "")  # 1.1 KiB short
    assert check_config(64, 128, 3, "bf16", 3, 1, 2) is None
    assert "EPILOGUE must be" in (check_config(128, 128, 2, "bf16", 2, 1, 3) or "")


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_early_k_release_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``RELEASE_K`` (a K slot freed after its scores, a V slot after its P V, each with its own barrier):
    outputs (NaN-filled first) and log-sum-exp against fp32 math with every consumer loop (plain, overlapped,
    ping-pong, chained; three consumers at D = 64), two and three stages, at a ragged length (S = 1000), where a
    wrong phase or a slot freed too early shows as stale keys or a hang."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 11)
    persistent = {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True}
    variants = [{}, {"OVERLAP": True}, persistent, {**persistent, "PINGPONG": True}, {**persistent, "CHAIN": True},
                {**persistent, "NUM_BUFFERS": 3}] + ([{**persistent, "CONSUMERS": 3}] if shape[3] == 64 else [])
    for knobs in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal,
                             **{"BLOCK_N": 128, "NUM_BUFFERS": 2, **knobs, "RELEASE_K": True})  # fmt: skip


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["THREAD_ARRIVE", "WARP_ARRIVE"])
def test_gpu_thread_arrive_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool, mode: str) -> None:
    """``THREAD_ARRIVE`` (every consumer thread arrives on the K/V empty barriers, 128 a consumer) and
    ``WARP_ARRIVE`` (lane 0 of each warp, in inline PTX at the barriers' offset): outputs (NaN-filled first) and
    log-sum-exp against fp32 math with every consumer loop, with and without ``RELEASE_K``, at a ragged length,
    where a slot freed before its wgmma finished shows as stale keys and a miscounted barrier or a wrong offset as
    a hang."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 13)
    persistent = {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True}
    variants = [{}, {"OVERLAP": True}, persistent, {**persistent, "PINGPONG": True, "EPILOGUE": 2},
                {**persistent, "CHAIN": True}, {**persistent, "RELEASE_K": False, "NUM_BUFFERS": 3}]
    if shape[3] == 64:
        variants += [{**persistent, "CONSUMERS": 3, "NUM_BUFFERS": 3},
                     {**persistent, "CONSUMERS": 1, "CTAS_PER_SM": 2, "EPILOGUE": 2}]  # fmt: skip
    for knobs in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal,
                             **{"BLOCK_N": 128, "NUM_BUFFERS": 2, "RELEASE_K": True, **knobs, mode: True})  # fmt: skip


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 16, 1024, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilogue", [1, 2])
def test_gpu_vector_epilogue_matches_fp32_attention(shape: tuple[int, int, int, int], causal: bool,
                                                    epilogue: int) -> None:  # fmt: skip
    """``EPILOGUE`` 1 and 2 (the output stored as 16-byte vectors after a layout conversion in each consumer, or
    an exchange within each row's lanes): outputs (NaN-filled first: a row never stored fails) and log-sum-exp
    against fp32 math, one program per tile and persistent, chained tiles, two and three consumers, at a ragged
    length (S = 1000)."""
    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + 7)
    persistent = {"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True}
    variants = [{}, persistent, {**persistent, "CHAIN": True}] + ([{"CONSUMERS": 3}] if shape[3] == 64 else [])
    for knobs in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal, BLOCK_N=128, NUM_BUFFERS=2,
                             EPILOGUE=epilogue, **knobs)  # fmt: skip


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 4, 2048, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_gluon_attention_trial_and_log_sum_exp(shape: tuple[int, int, int, int], causal: bool) -> None:
    import math

    import torch

    from kernels.attention.attention_ws import attention_ws
    from objectives.flash_attention import FlashAttention
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    batch, heads, seq_len, head_dim = shape
    workload = FlashAttention(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, causal=causal)
    variants = [(64, False, False, False, 2, False), (128, True, False, True, 2, False),
                (128, True, True, False, 2, False), (128, True, True, True, 2, False),
                (128, True, False, True, 2, True)]  # fmt: skip
    if head_dim == 64:  # three consumers: D = 64 only
        variants += [(128, True, True, True, 3, False), (64, False, False, False, 3, False),
                     (128, True, True, True, 3, True)]  # fmt: skip
    for block_n, overlap, persistent, pingpong, consumers, one_loop in variants:
        config = _config(block_n=block_n, stages=2, overlap=overlap, persistent=persistent, PINGPONG=pingpong,
                         CONSUMERS=consumers, ONE_LOOP=one_loop)  # fmt: skip
        result = workload.run(config, device, TrialContext(trial_number=1))
        assert result.status is TrialStatus.OK, (config, result.error)
    chained = _config(block_n=128, stages=3, persistent=True, ONE_LOOP=True, CHAIN=True)
    result = workload.run(chained, device, TrialContext(trial_number=2))
    assert result.status is TrialStatus.OK, (chained, result.error)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    lse = torch.empty(shape[:3], device="cuda", dtype=torch.float32)
    attention_ws(q, k, v, causal=causal, lse=lse, OVERLAP=True, PERSISTENT=True)
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(head_dim)
    if causal:
        scores = scores.masked_fill(torch.ones(seq_len, seq_len, device="cuda", dtype=torch.bool).triu(1), -math.inf)
    expected = torch.logsumexp(scores, dim=-1) / math.log(2.0)
    assert torch.allclose(lse, expected, atol=1e-2), (lse - expected).abs().max()


@pytest.mark.timeout(60)
def test_three_consumers_are_checked_before_compiling() -> None:
    """Three consumer warpgroups leave 160 registers a thread: D = 64 only, and the budget is bounded."""
    from kernels.attention.attention_ws import _check
    from kernels.attention.attention_ws_rules import check_config, consumer_regs_limit

    assert (consumer_regs_limit(2), consumer_regs_limit(3)) == (240, 160)
    assert check_config(64, 128, 3, "bf16", 3) is None
    assert "head_dim 64 only" in (check_config(128, 128, 2, "bf16", 3) or "")
    assert "CONSUMERS must be one of" in (check_config(64, 128, 2, "bf16", 4) or "")
    with pytest.raises(ValueError, match=r"CONSUMER_REGS must be a multiple of 8 in \[24, 160\]"):
        _check(64, "bf16", {"CONSUMERS": 3, "CONSUMER_REGS": 240})


@pytest.mark.timeout(60)
def test_the_kernel_and_the_workload_refuse_a_knob_combination_with_the_same_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """One rule book (``kernels.attention.attention_ws_rules``): the workload's static check and the kernel's launch
    check
    give the same reason for knobs that cannot go together, and the rules import without torch."""
    import subprocess
    import sys

    from kernels.attention.attention import PRECISIONS
    from kernels.attention.attention_ws import _check
    from kernels.attention.attention_ws_rules import PRECISIONS as RULE_PRECISIONS
    from objectives.flash_attention import FlashAttention

    assert RULE_PRECISIONS == PRECISIONS
    code = "import sys, kernels.attention.attention_ws_rules; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    workload = FlashAttention(batch=2, heads=16, seq_len=4096, head_dim=128, causal=True)
    for knobs in ({"OVERLAP": False, "PINGPONG": True}, {"PERSISTENT": True, "ONE_LOOP": False, "CHAIN": True},
                  {"HALF_DIAG": True, "PINGPONG": True}, {"HALF_DIAG": True, "BLOCK_N": 64}, {"EXP_POLY": 7},
                  {"SUM_MMA": True, "PERSISTENT": True, "ONE_LOOP": True, "CHAIN": True}, {"LPT_HEADS": 64},
                  {"LPT_HEADS": 48, "PERSISTENT": True}):
        config = {**_config(stages=2, block_n=knobs.get("BLOCK_N", 128)), **knobs}
        with pytest.raises(ValueError) as refused:
            _check(128, "bf16", {"NUM_BUFFERS": 2, "OVERLAP": True, **knobs})
        assert workload.static_check(config, H200) == str(refused.value), knobs


@pytest.mark.timeout(60)
def test_row_sums_by_wgmma_are_checked_before_compiling() -> None:
    """``SUM_MMA`` takes 2 KiB of ones beside the K/V ring (three stages at D = 128 no longer fit with the vector
    epilogue), a second copy of P that three consumers cannot hold, and the tile loops, not ``CHAIN``'s stream."""
    from kernels.attention.attention_ws import _check
    from kernels.attention.attention_ws_rules import check_config

    assert check_config(128, 128, 2, "bf16", 2, 1, 2, sum_mma=True) is None
    assert check_config(64, 128, 3, "bf16", 2, 1, 2, sum_mma=True) is None
    assert check_config(128, 128, 3, "bf16", 2, 1, 0, sum_mma=False) is None
    assert "the ones of SUM_MMA" in (check_config(128, 128, 3, "bf16", 2, 1, 2, sum_mma=True) or "")
    with pytest.raises(ValueError, match="it needs CONSUMERS=1 or 2"):
        _check(64, "bf16", {"CONSUMERS": 3, "NUM_BUFFERS": 3, "SUM_MMA": True})
    with pytest.raises(ValueError, match="SUM_MMA adds a row-sum wgmma to the tile loops"):
        _check(64, "bf16", {"SUM_MMA": True, "PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True, "CHAIN": True})


@pytest.mark.timeout(300)
def test_streamed_last_round_publishes_and_merges_parts_under_flags(aot_child: Any) -> None:
    """``STREAM_KV`` (sm_90 PTX, no GPU): each consumer publishes a part behind one flag (a release exchange) and
    merges parts after acquiring their flags (a compare-and-swap before and inside its wait loop), in two- and
    three-consumer persistent loops and with ``SUM_MMA``; without the knob no flag is touched. The slots are in
    global memory: shared memory grows by a few words at most (a flag's value crosses the warps through one)."""
    loops = ((64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2}),
             (128, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True, "SUM_MMA": True}),
             (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 3, "BLOCK_N": 64}))  # fmt: skip
    for (d, extra), (off, on) in zip(loops, _without_and_with(aot_child, "STREAM_KV", loops), strict=True):
        consumers = extra.get("CONSUMERS", 2)
        assert off["flag_releases"] == off["flag_acquires"] == 0, off
        assert on["flag_releases"] == consumers and on["flag_acquires"] == 2 * consumers, on
        assert 0 <= on["shared"] - off["shared"] <= 128, (d, off["shared"], on["shared"])


@pytest.mark.timeout(60)
def test_streamed_last_round_is_checked_before_compiling() -> None:
    """``STREAM_KV`` needs the persistent grid's one-loop, overlapped tiles (each part of a tile is such a loop over
    some of its key blocks), not ``HALF_DIAG`` or ``CHAIN``, and key blocks that divide a tile's rows (a key block's
    tile is found from the blocks a tile reads); its grid is every SM."""
    from kernels.attention.attention_ws import _check, _grid

    stream = {"STREAM_KV": True, "PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True}
    _check(64, "bf16", stream)
    _check(64, "bf16", {**stream, "CONSUMERS": 3, "BLOCK_N": 64})
    with pytest.raises(ValueError, match="it needs PERSISTENT=true, OVERLAP=true, ONE_LOOP=true"):
        _check(64, "bf16", {**stream, "ONE_LOOP": False})
    with pytest.raises(ValueError, match="HALF_DIAG=false"):
        _check(64, "bf16", {**stream, "HALF_DIAG": True})
    with pytest.raises(ValueError, match="BLOCK_N to divide the tile's 192 rows: got BLOCK_N=128"):
        _check(64, "bf16", {**stream, "CONSUMERS": 3})
    meta = {"PERSISTENT": True, "STREAM_KV": True, "CONSUMERS": 2, "CAUSAL": True, "CTAS_PER_SM": 1}
    assert _grid(2, 1024, meta, 132) == (132,)  # 8 items: their key blocks still go to every SM


@pytest.mark.timeout(300)
def test_double_buffered_q_takes_a_second_q_tile_of_shared_memory(aot_child: Any) -> None:
    """``Q_BUFFERS=2`` (sm_90 PTX, no GPU): a second 64 x D Q tile a consumer in shared memory and its two barriers,
    the same wgmmas, in the persistent one-loop, ping-pong and three-consumer loops; the static check counts it (two
    buffers and three K/V stages do not fit at D = 128) and refuses it outside the persistent grid and with CHAIN."""
    from kernels.attention.attention_ws import _check
    from kernels.attention.attention_ws_rules import check_config

    loops = ((64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2}),
             (128, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True}),
             (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 3, "BLOCK_N": 64}))  # fmt: skip
    jobs = [{"shape": [2, 16, 1024, d], "config": {"causal": True, "BLOCK_N": 128, "NUM_BUFFERS": 2,
                                                   "RELEASE_K": True, **extra, "Q_BUFFERS": qb}}
            for d, extra in loops for qb in (1, 2)]  # fmt: skip
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for (d, extra), one, two in zip(loops, lines[::2], lines[1::2], strict=True):
        q_tiles = 2 * 64 * d * extra.get("CONSUMERS", 2)
        assert q_tiles <= two["shared"] - one["shared"] <= q_tiles + 1024, (d, one["shared"], two["shared"])
        assert two["wgmma"] == one["wgmma"], (one, two)
    assert check_config(128, 128, 2, "bf16", 2, 1, 2, q_buffers=2) is None
    assert "2 x Q 128x128" in (check_config(128, 128, 3, "bf16", 2, 1, 0, q_buffers=2) or "")
    assert "Q_BUFFERS must be one of" in (check_config(64, 128, 2, "bf16", q_buffers=3) or "")
    with pytest.raises(ValueError, match="it needs PERSISTENT=true, CHAIN=false"):
        _check(64, "bf16", {"Q_BUFFERS": 2, "OVERLAP": True})
    with pytest.raises(ValueError, match="it needs PERSISTENT=true, CHAIN=false"):
        _check(64, "bf16", {"Q_BUFFERS": 2, "PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True, "CHAIN": True})


@pytest.mark.timeout(300)
def test_longest_first_schedule_reads_each_programs_tiles_from_its_table(aot_child: Any) -> None:
    """``LPT_HEADS`` (sm_90 PTX, no GPU): the persistent loops read the program's tile list from global memory (its
    bounds and an entry a tile, in the loader and each consumer) and run the same wgmmas in the same shared memory,
    in the two-consumer (one loop, ping-pong, two Q buffers) and three-consumer loops."""
    loops = ((64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "EPILOGUE": 2}),
             (128, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "PINGPONG": True}),
             (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "NUM_BUFFERS": 3, "Q_BUFFERS": 2}),
             (64, {"OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True, "CONSUMERS": 3, "BLOCK_N": 64}))  # fmt: skip
    jobs = [{"shape": [2, 16, 1024, d], "config": {"causal": True, "BLOCK_N": 128, "NUM_BUFFERS": 2,
                                                   "RELEASE_K": True, **extra, "LPT_HEADS": heads}}
            for d, extra in loops for heads in (0, 64)]  # fmt: skip
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert len(lines) == len(jobs), lines
    for (d, extra), off, on in zip(loops, lines[::2], lines[1::2], strict=True):
        partitions = extra.get("CONSUMERS", 2) + 1
        assert on["global_loads"] >= off["global_loads"] + 3 * partitions, (d, extra, off, on)
        assert on["wgmma"] == off["wgmma"] and on["shared"] == off["shared"], (off, on)


@pytest.mark.timeout(60)
def test_longest_first_schedule_gives_every_tile_once_and_ends_the_programs_together() -> None:
    """:func:`kernels.attention.attention_ws_rules.lpt_schedule`: every query tile of every head exactly once,
    programs' lists
    behind ``programs + 1`` offsets, each list in group order (a group's K/V stays in L2 while its tiles run); at the
    causal target shapes the most loaded program carries at most 1% over the mean (key blocks plus the tile
    overhead), where the round-robin pairs leave 3.1% (a partial last round of equal items). The rules: a
    persistent grid without CHAIN or STREAM_KV, a group size from the list; the grid counts tiles, not pairs."""
    from kernels.attention.attention_ws import _check, _grid
    from kernels.attention.attention_ws_rules import (
        LPT_TILE_OVERHEAD,
        lpt_schedule,
        query_tiles,
        tile_blocks,
        work_items,
    )

    def work(tiles: list[int], num_m: int, seq_len: int, causal: bool) -> float:
        return sum(tile_blocks(t % num_m, seq_len, 128, 2, causal) + LPT_TILE_OVERHEAD for t in tiles)

    for bh, seq_len, causal, group in ((512, 1024, True, 64), (256, 2048, True, 64), (7, 1000, True, 16),
                                       (3, 777, False, 16), (40, 4096, True, 128)):  # fmt: skip
        num_m, programs = query_tiles(seq_len, 2), min(132, bh * query_tiles(seq_len, 2))
        table = lpt_schedule(bh, seq_len, 2, 128, causal, programs, group)
        offsets = table[: programs + 1]
        assert offsets[0] == programs + 1 and offsets[-1] == len(table) and offsets == sorted(offsets)
        lists = [table[offsets[p] : offsets[p + 1]] for p in range(programs)]
        assert sorted(table[programs + 1 :]) == list(range(bh * num_m)), (bh, seq_len)
        assert all(own for own in lists)  # the kernel reads a program's first entry before its loop
        for own in lists:
            groups = [t // num_m // group for t in own]
            assert groups == sorted(groups), own
        loads = [work(own, num_m, seq_len, causal) for own in lists]
        if (bh, seq_len) in ((512, 1024), (256, 2048)):
            assert max(loads) / (sum(loads) / programs) <= 1.01, (seq_len, max(loads), sum(loads) / programs)
            pairs = [0.0] * programs  # the default: item i of the pairs to program i % programs
            for item in range(work_items(bh, seq_len, 2, causal)):
                k = item % ((num_m + 1) // 2)
                pairs[item % programs] += work([num_m - 1 - k, k] if num_m - 1 - k != k else [k], num_m, seq_len, True)
            assert max(pairs) / (sum(pairs) / programs) >= 1.03, max(pairs) / (sum(pairs) / programs)
    lpt = {"LPT_HEADS": 64, "PERSISTENT": True}
    _check(64, "bf16", {**lpt, "OVERLAP": True, "ONE_LOOP": True, "Q_BUFFERS": 2})
    with pytest.raises(ValueError, match="LPT_HEADS gives each persistent program a list of tiles"):
        _check(64, "bf16", {"LPT_HEADS": 64})
    with pytest.raises(ValueError, match="STREAM_KV=false"):
        _check(64, "bf16", {**lpt, "OVERLAP": True, "ONE_LOOP": True, "STREAM_KV": True})
    with pytest.raises(ValueError, match="LPT_HEADS must be one of"):
        _check(64, "bf16", {**lpt, "LPT_HEADS": 48})
    meta = {"PERSISTENT": True, "CONSUMERS": 2, "CAUSAL": True, "CTAS_PER_SM": 1}
    assert _grid(3, 1024, meta, 132) == (12,) and _grid(3, 1024, {**meta, "LPT": True}, 132) == (24,)


@pytest.mark.timeout(60)
def test_one_consumer_programs_share_an_sm_within_its_registers_and_shared_memory() -> None:
    """One consumer warpgroup a program (64 query rows) with two programs an SM: 128 registers a thread at launch,
    232 for the consumer; a K/V ring that fits twice in the SM's 228 KiB; no ping-pong (no one to hand over to)."""
    from kernels.attention.attention_ws import _check, _grid
    from kernels.attention.attention_ws_rules import _maxnreg, check_config, consumer_regs_limit

    assert (_maxnreg(1, 2), consumer_regs_limit(1, 2), consumer_regs_limit(1)) == (128, 232, 256)
    assert check_config(128, 64, 2, "bf16", 1, 2) is None  # 82 KB a program
    assert check_config(64, 128, 2, "bf16", 1, 2) is None
    assert "for 2 program(s) per SM exceeds" in (check_config(128, 128, 2, "bf16", 1, 2) or "")  # 148 KB
    assert "CTAS_PER_SM must be one of" in (check_config(64, 64, 2, "bf16", 1, 3) or "")
    assert "head_dim 64 only" in (check_config(128, 64, 2, "bf16", 2, 2) or "")  # two consumers: 104 registers
    with pytest.raises(ValueError, match="PINGPONG passes the turn between consumers"):
        _check(128, "bf16", {"CONSUMERS": 1, "OVERLAP": True, "PINGPONG": True, "BLOCK_N": 64})
    meta = {"PERSISTENT": True, "CONSUMERS": 1, "CAUSAL": False, "HEAD_MAJOR": True, "CTAS_PER_SM": 2}
    assert _grid(256, 1024, meta, 132) == (264,)  # two programs an SM, 16 tiles of 64 rows a head
    assert _grid(2, 1024, meta, 132) == (32,)


@pytest.mark.parametrize("phase, knob, values", [("half_diag", "HALF_DIAG", [False, True]),
                                                 ("exp_poly", "EXP_POLY", [0, 1, 2, 3, 4]),
                                                 ("sum_mma", "SUM_MMA", [False, True]),
                                                 ("stream_kv", "STREAM_KV", [False, True]),
                                                 ("q_buffers", "Q_BUFFERS", [1, 2]),
                                                 ("lpt", "LPT_HEADS", [0, 32, 64]),
                                                 ("lpt_combo", "LPT_HEADS", [0, 16, 32]),
                                                 ("lpt_long", "LPT_HEADS", [0, 16, 32]),
                                                 ("full_combo", "SUM_MMA", [False, True])])  # fmt: skip
def test_knob_phases_offer_each_loop_with_every_value_of_the_knob_within_the_rules(phase: str, knob: str,
                                                                                   values: list) -> None:  # fmt: skip
    """``bench/attention_ws.py half_diag``, ``exp_poly`` and ``sum_mma``: every candidate loop comes with every value
    of the phase's knob (without it: the contrast the phase re-measures), all pass the kernel's knob rules, and at
    each head dim some fit the shared memory with the knob off and on."""
    from bench.attention_ws import PER_SHAPE_PHASES, _unusable
    from kernels.attention.attention_ws import _check

    configs, contrast = PER_SHAPE_PHASES[phase]
    assert contrast == knob
    loops = {json.dumps({**c, knob: values[0]}, sort_keys=True) for c in configs}
    assert len(loops) * len(values) == len(configs)  # each loop once with each value
    assert {json.dumps({**c, knob: values[0]}, sort_keys=True) for c in configs if c[knob] == values[-1]} == loops
    for config in configs:
        _check(64, "bf16", dict(config))  # raises naming the knob it refuses
    for d in (64, 128):
        usable = [c for c in configs if _unusable(d, c) is None]
        assert {c[knob] != values[0] for c in usable} == {False, True}, d


def test_contrast_sides_are_the_knob_at_its_default_and_away_from_it() -> None:
    """A per-shape phase re-measures the fastest config on the other side of its contrast knob: for knobs whose
    default is 1 (``Q_BUFFERS``, ``CTAS_PER_SM``) the sides are 1 and not 1, not truthy and falsy (1 and 2 were both
    on one side, so the q_buffers phase re-measured no contrast)."""
    from bench.attention_ws import _knob_on

    assert not _knob_on({"Q_BUFFERS": 1}, "Q_BUFFERS") and _knob_on({"Q_BUFFERS": 2}, "Q_BUFFERS")
    assert not _knob_on({}, "CTAS_PER_SM") and _knob_on({"CTAS_PER_SM": 2}, "CTAS_PER_SM")
    assert not _knob_on({"SUM_MMA": False}, "SUM_MMA") and _knob_on({"SUM_MMA": True}, "SUM_MMA")
    assert not _knob_on({"EXP_POLY": 0}, "EXP_POLY") and _knob_on({"EXP_POLY": 3}, "EXP_POLY")


def test_persistent_grid_counts_its_work_items_once() -> None:
    """The persistent grid and the wave benchmark count work items with one function: 128-row tiles (two
    consumers) or 192-row ones (three), causal items pairing two tiles; the grid is capped at the SMs."""
    from bench.attention_waves import winners
    from kernels.attention.attention_ws import _grid
    from kernels.attention.attention_ws_rules import work_items

    assert work_items(256, 1024, 2, causal=True) == 1024 and work_items(256, 1024, 2, causal=False) == 2048
    assert work_items(1, 1000, 3, causal=False) == 6 and work_items(1, 1000, 3, causal=True) == 3
    meta = {"PERSISTENT": True, "CONSUMERS": 2, "CAUSAL": True, "HEAD_MAJOR": False}
    assert _grid(256, 1024, meta, 132) == (132,) and _grid(2, 1024, meta, 132) == (8,)
    configs = winners()  # the S = 1024 winners, read from the target run's results
    assert set(configs) == {(128, True), (128, False), (64, True), (64, False)}
    assert all(c["PERSISTENT"] for c in configs.values())


def _inputs_and_fp32_reference(shape: tuple[int, int, int, int], causal: bool, seed: int) -> tuple[Any, ...]:
    """bf16 Q, K, V of ``shape`` (CUDA) and, in fp32 math, the attention output and base-2 log-sum-exp."""
    import math

    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(shape[3])
    if causal:
        mask = torch.ones(shape[2], shape[2], device="cuda", dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, -math.inf)
    expected = torch.softmax(scores, -1) @ v.float()
    expected_lse = torch.logsumexp(scores, dim=-1) / math.log(2.0)
    return q, k, v, expected, expected_lse


def _assert_matches_fp32(q: Any, k: Any, v: Any, expected: Any, expected_lse: Any, causal: bool,
                         **knobs: Any) -> None:  # fmt: skip
    """One :func:`kernels.attention.attention_ws.attention_ws` launch with ``knobs`` into NaN-filled output and
    log-sum-exp
    (a row never stored fails), both against the fp32 reference of :func:`_inputs_and_fp32_reference`."""
    import torch

    from kernels.attention.attention_ws import attention_ws

    lse = torch.full(q.shape[:3], float("nan"), device="cuda", dtype=torch.float32)
    out = torch.full_like(q, float("nan"))
    attention_ws(q, k, v, causal=causal, lse=lse, out=out, **knobs)
    error = ((out.float() - expected).abs().max() / expected.abs().max()).item()
    assert error < 1e-2, (knobs, error)
    assert torch.allclose(lse, expected_lse, atol=1e-2), (knobs, (lse - expected_lse).abs().max())


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 64), (2, 4, 2048, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_three_consumers_and_one_loop_match_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """192 query rows a program (a ragged last tile at S = 1000), one program per tile and persistent, with and
    without the overlap and the three-way ping-pong, and one loop over a tile's key blocks (the diagonal masked
    behind a branch) with two and three consumers: outputs and log-sum-exp against fp32 math."""

    import torch

    from kernels.attention.attention_ws import attention_ws

    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2])
    for block_n, overlap, persistent, pingpong, consumers, one_loop in (
        (128, True, True, False, 3, False), (128, True, True, True, 3, False), (64, False, False, False, 3, False),
        (128, True, False, True, 3, False), (128, True, True, True, 3, True), (64, False, True, False, 2, True),
        (128, True, False, True, 2, True),
    ):  # fmt: skip
        lse = torch.empty(shape[:3], device="cuda", dtype=torch.float32)
        knobs = {"OVERLAP": overlap, "PERSISTENT": persistent, "PINGPONG": pingpong, "CONSUMERS": consumers,
                 "ONE_LOOP": one_loop}  # fmt: skip
        out = attention_ws(q, k, v, causal=causal, lse=lse, BLOCK_N=block_n, NUM_BUFFERS=3, **knobs)
        error = ((out.float() - expected).abs().max() / expected.abs().max()).item()
        assert error < 1e-2, (block_n, overlap, persistent, pingpong, consumers, one_loop, error)
        assert torch.allclose(lse, expected_lse, atol=1e-2), (lse - expected_lse).abs().max()


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(3, 8, 1000, 64), (2, 16, 2048, 128), (2, 16, 1024, 64)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
def test_gpu_chained_tiles_match_fp32_attention(shape: tuple[int, int, int, int], causal: bool) -> None:
    """``CHAIN``: each persistent program runs its tiles as one stream (a tile's output stored while the next
    tile's first scores are in flight, its accumulator cleared by the rescale). The shapes give programs one to
    four tiles (more work items than SMs), a ragged last tile (S = 1000), and causal pairs of tiles: outputs and
    log-sum-exp against fp32 math, with two and three consumers, key blocks of 64 and 128, 2 and 3 stages."""

    q, k, v, expected, expected_lse = _inputs_and_fp32_reference(shape, causal, shape[2] + shape[3])
    variants = [(128, 3, 2), (64, 2, 2), (128, 2, 2)] + ([(128, 2, 3), (64, 3, 3)] if shape[3] == 64 else [])
    for block_n, stages, consumers in variants:
        _assert_matches_fp32(q, k, v, expected, expected_lse, causal, BLOCK_N=block_n, NUM_BUFFERS=stages,
                             OVERLAP=True, PERSISTENT=True, ONE_LOOP=True, CHAIN=True,
                             CONSUMERS=consumers)  # fmt: skip


def test_a_launch_checks_and_derives_a_config_once_and_refuses_a_bad_one_every_time() -> None:
    """``attention_ws`` takes its constexprs from :func:`_checked_meta`: the rules' verdict and ``_meta`` kept per
    config (host time a launch), equal to checking afresh; a refused config raises on every call, and an unhashable
    knob value is checked without the cache."""
    pytest.importorskip("triton.experimental.gluon")
    from kernels.attention.attention_ws import _check, _checked_meta, _meta

    knobs = {"BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": True, "PERSISTENT": True, "ONE_LOOP": True,
             "EPILOGUE": 2, "RELEASE_K": True, "HALF_DIAG": True, "LPT_HEADS": 32}  # fmt: skip
    first = _checked_meta(64, "bf16", True, True, dict(knobs))
    _check(64, "bf16", knobs)
    assert first == _meta(64, True, True, **knobs)
    assert _checked_meta(64, "bf16", True, True, dict(reversed(knobs.items()))) is first  # same config, any order
    assert _checked_meta(64, "bf16", False, True, knobs)["CAUSAL"] is False  # the mask is part of the key
    # 2.0 equals 2 as a key, but is another constexpr: not served 2's entry
    assert type(_checked_meta(64, "bf16", True, True, {**knobs, "NUM_BUFFERS": 2.0})["NUM_BUFFERS"]) is float
    for _ in range(2):
        with pytest.raises(ValueError, match="NUM_BUFFERS must be 2, 3 or 4"):
            _checked_meta(64, "bf16", True, True, {**knobs, "NUM_BUFFERS": 5})
    with pytest.raises(ValueError):
        _checked_meta(64, "bf16", True, True, {**knobs, "NUM_BUFFERS": [2]})  # unhashable: checked, refused


def test_descriptors_share_one_shared_layout_per_box() -> None:
    """The TMA descriptors' NVMMA layouts are worked out once per box and dtype (``_shared_layout``), and equal what
    Gluon derives afresh."""
    pytest.importorskip("triton.experimental.gluon")
    import torch
    from triton.experimental.gluon import language as gl

    from kernels.attention.attention_ws import _shared_layout

    assert _shared_layout(128, 64, torch.bfloat16) is _shared_layout(128, 64, torch.bfloat16)
    assert _shared_layout(128, 64, torch.bfloat16) == gl.NVMMASharedLayout.get_default_for([128, 64], gl.bfloat16)
    assert _shared_layout(64, 128, torch.float16) == gl.NVMMASharedLayout.get_default_for([64, 128], gl.float16)
