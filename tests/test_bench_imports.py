"""Every project name the benchmark scripts import exists.

The scripts import lazily, inside functions, so that ``--help`` works without a GPU; a
renamed or removed function would otherwise surface only on the GPU machine.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("tuner", "kernels", "objectives", "models", "search_spaces", "bench")
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def _project_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from <project module> import name`` in the file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in PROJECT_PACKAGES:
                found.extend((node.lineno, node.module, alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_bench_script_imports_exist(script: Path) -> None:
    missing = []
    for line, module, name in _project_imports(script):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"line {line}: from {module} import {name}")
    assert not missing, f"{script.name} imports names that do not exist: {missing}"


def test_the_check_sees_nested_imports() -> None:
    imports = _project_imports(ROOT / "bench" / "attention_study.py")
    assert ("kernels.gemm.gemm", "max_rel_error") in {(m, n) for _, m, n in imports}


def test_suite_steps_name_scripts_tests_and_candidates_that_exist() -> None:
    """``bench/run_suite.py``: every step's script and test file exists, every ``file::test`` id names a test
    function of that file, and ``int4_decode.py --names`` lists candidates the script defines: a typo would
    otherwise cost a step of a GPU session."""
    from bench.int4_decode import CANDIDATES
    from bench.run_suite import STEPS

    for name, _, command in STEPS:
        for part in command:
            path, _, test = part.partition("::")
            if path.startswith(("bench/", "tests/")):
                assert (ROOT / path).exists(), (name, part)
            if test:
                assert f"def {test}(" in (ROOT / path).read_text(), (name, part)
        if any(script in command for script in ("bench/int4_decode.py", "bench/decode_profile.py")) and (
            "--names" in command
        ):
            names = command[command.index("--names") + 1 : command.index("--out")]
            assert names and set(names) <= set(CANDIDATES), (name, names)


def test_decode_targets_take_the_best_configs_and_give_the_ratio_span_over_rounds() -> None:
    """``bench/int4_decode.py``'s targets: the fastest bf16 config against the fastest int4 config with top-1 >= 0.95
    (a faster int4 config below it is passed over), medians, and the ratio's span over the rounds."""
    from bench.int4_decode import targets_of

    def runs(*speeds: float) -> list[dict]:
        return [{"metrics": {"tokens_per_s": s}} for s in speeds]

    entry = {
        "batch": 8, "seed": 0,
        "runs": {"bf16_a": runs(100.0, 110.0), "bf16_b": runs(90.0, 90.0), "int4_ok": runs(120.0, 130.0),
                 "int4_fast": runs(200.0, 200.0)},
        "median_tokens_per_s": {"bf16_a": 105.0, "bf16_b": 90.0, "int4_ok": 125.0, "int4_fast": 200.0},
        "top1": {"bf16_a": 0.99, "bf16_b": 0.99, "int4_ok": 0.96, "int4_fast": 0.90},
    }  # fmt: skip
    (target,) = targets_of([entry])
    assert target["baseline_config"] == "bf16_a" and "int4_ok" in target["target"]
    assert target["ratio"] == pytest.approx(125.0 / 105.0) and target["goal"] == 1.25 and target["verdict"] == "missed"
    assert target["ratio_range"] == pytest.approx([120.0 / 110.0, 130.0 / 100.0])
    entry["runs"]["int4_ok"] = runs(125.0)  # one round: no span
    assert targets_of([entry])[0]["ratio_range"] is None


def test_ratio_span_pairs_interleaved_rounds_and_bounds_the_others() -> None:
    from bench.common import ratio_span

    assert ratio_span([10.0, 12.0, 11.0], [5.0, 6.0, 4.0]) == pytest.approx([2.0, 2.75])  # per-round pairs
    assert ratio_span([10.0, 12.0], [5.0, 6.0], paired=False) == pytest.approx([10 / 6, 12 / 5])  # widest
    assert ratio_span([10.0, float("nan"), 12.0], [5.0, 6.0, 4.0]) == pytest.approx([2.0, 3.0])  # NaN rounds out
    assert ratio_span([10.0], [5.0]) is None and ratio_span([10.0, 11.0], []) is None


def test_int4_gemm_targets_carry_the_span_of_each_ratio_over_the_rounds() -> None:
    """``bench/int4_roofline.py``'s targets from interleaved samples: the speed-ups' spans pair each round's bf16
    and int4 times, the bandwidth fraction's follows the int4 times, and M = 16 against M = 1 (measured apart) takes
    the widest span; entries without samples (older files) give None."""
    from bench.int4_roofline import make_targets, medians_of

    def entry(bits: int, m: int, packed: list[float], bf16: list[float]) -> dict:
        samples = {"packed": packed, "bf16_matmul": bf16}
        us = medians_of(samples)
        return {"bits": bits, "n": 4096, "k": 4096, "m": m, "interleaved_us": us, "interleaved_samples_us": samples,
                "speedup_vs_bf16": us["bf16_matmul"] / us["packed"], "bandwidth_fraction": 0.8}  # fmt: skip

    entries = [entry(4, 1, [10.0, 11.0, 12.0], [30.0, 30.0, 33.0]), entry(4, 16, [12.0, 12.5, 13.0], [31.0] * 3),
               entry(4, 64, [20.0, 25.0, 22.0], [30.0, 30.0, 30.0]), entry(8, 1, [16.0, 17.0, 18.0], [30.0] * 3)]
    targets = {t["target"].split(":")[0] + (" bw" if "bandwidth" in t["target"] else ""): t
               for t in make_targets(entries)}  # fmt: skip
    assert targets["int4 M=1 N=4096 K=4096 bw"]["ratio_range"] == pytest.approx([0.8 * 11 / 12, 0.8 * 11 / 10])
    assert targets["int4 M=1 N=4096 K=4096"]["ratio_range"] == pytest.approx([30 / 11, 3.0])
    assert targets["int4 M=16 N=4096 K=4096"]["ratio_range"] == pytest.approx([1.25 * 10 / 13, 1.25 * 12 / 12])
    assert targets["int4 M=64 N=4096 K=4096"]["ratio_range"] == pytest.approx([1.2, 1.5])
    assert targets["int8 M=1 N=4096 K=4096"]["ratio_range"] == pytest.approx([30 / 18, 30 / 16])
    for e in entries:
        del e["interleaved_samples_us"]
    assert all(t["ratio_range"] is None for t in make_targets(entries))


def test_attention_targets_carry_the_per_round_ratio_span_against_the_faster_backend() -> None:
    from bench.attention_ws import _target

    values = {"ws0": [400.0, 410.0, 390.0], "cudnn": [380.0, 400.0, 390.0], "flash": [300.0, 310.0, 305.0]}
    target = _target({"head_dim": 64, "causal": True, "seq_len": 1024}, values, "ws0")
    assert target["target"].endswith("vs SDPA cudnn") and target["ratio"] == pytest.approx(400 / 390, abs=1e-4)
    assert target["ratio_range"] == pytest.approx([1.0, 400 / 380], abs=1e-4) and target["verdict"] == "met"


def test_kernel_variant_targets_pair_the_tuned_rounds_with_the_named_baseline() -> None:
    from bench.kernel_variants import _target_row

    values = {"tuned": [700.0, 690.0, 710.0], "baseline": [680.0, 700.0, 690.0], "flash": [500.0, 500.0, 500.0]}
    row = _target_row("GEMM bf16 8192 vs torch.matmul", values, "baseline", 1.0)
    assert row["ratio"] == pytest.approx(700 / 690, abs=1e-4) and row["verdict"] == "met"
    assert row["ratio_range"] == pytest.approx([690 / 700, 700 / 680], abs=1e-4)  # round pairs
    assert _target_row("no library", values, None, 1.0)["ratio_range"] is None


def test_kernel_variants_picks_the_winner_by_medians_of_interleaved_rounds_not_the_sweeps_one_sample() -> None:
    from bench.kernel_variants import select_finalist

    calls: list[str] = []

    def measurer(name: str, values: list[float]) -> Callable[[], float]:  # a stopwatch stand-in: one value a call
        it = iter(values)
        return lambda: calls.append(name) or next(it)

    # "lucky" had the sweep's best single sample; over five rounds "steady" is faster, and "broken" never ran
    nan = float("nan")
    finalists = {"lucky": measurer("lucky", [760.0, 690.0, 692.0, 688.0, 691.0]),
                 "steady": measurer("steady", [700.0, 702.0, 699.0, 705.0, 701.0]),
                 "broken": measurer("broken", [nan] * 5)}  # fmt: skip
    name, samples = select_finalist(finalists, rounds=5)
    assert name == "steady" and samples["lucky"][0] == 760.0 and len(samples["broken"]) == 5
    assert calls[:6] == ["lucky", "steady", "broken", "lucky", "steady", "broken"]  # interleaved, round by round
    assert select_finalist({"only": measurer("only", [])}, rounds=5) == ("only", {})  # nothing to choose between
    with pytest.raises(RuntimeError, match="no finalist gave a finite time"):
        select_finalist({"a": measurer("a", [nan] * 3), "b": measurer("b", [nan] * 3)}, rounds=3)


def test_kernel_variants_finalists_add_the_best_gemm_configs_stream_k_twin_once() -> None:
    from bench.kernel_variants import _finalists

    ws = {"BLOCK_M": 128, "BLOCK_N": 256, "kernel": "persistent_tma_ws"}
    swept = [(737.0, {**ws, "STREAM_K": True}), (726.0, {**ws, "GROUP_M": 4}), (720.0, {**ws, "GROUP_M": 16})]
    assert _finalists(swept, 2, True) == [swept[0][1], swept[1][1], {**ws, "STREAM_K": False}]
    assert _finalists([(700.0, ws), (690.0, {**ws, "STREAM_K": True})], 4, True) == [ws, {**ws, "STREAM_K": True}]
    tutorial = {"BLOCK_M": 128, "kernel": "tutorial"}  # no stream-K tail to flip
    assert _finalists([(650.0, tutorial), *swept], 1, True) == [tutorial]
    attention = {"BLOCK_M": 128, "kernel": "persistent_tma"}  # attention's persistent kernels have no STREAM_K knob
    assert _finalists([(500.0, attention), (490.0, {**attention, "SPLIT_M": True})], 1, False) == [attention]


def test_kernel_variants_takes_gemm_shapes_by_name_or_dimensions() -> None:
    from bench.kernel_variants import GEMM_SHAPES, gemm_shape

    assert gemm_shape("8192^3") == GEMM_SHAPES["8192^3"]
    assert gemm_shape("8192x4096x14336") == (8192, 4096, 14336)  # m, n, k: a down projection
    for bad in ("8192x4096", "8192x0x4096", "axbxc"):
        with pytest.raises(ValueError, match="MxNxK"):
            gemm_shape(bad)


def test_kernel_variants_checks_its_gemm_targets_before_any_gpu_work() -> None:
    from bench.kernel_variants import GEMM_TARGETS, chosen_gemm_targets

    assert chosen_gemm_targets(None, None) == GEMM_TARGETS
    assert chosen_gemm_targets(["8192x4096x4096"], None) == [("8192x4096x4096", "bf16"), ("8192x4096x4096", "fp16")]
    assert chosen_gemm_targets(["8192^3", "1x2x3"], ["fp8"]) == [("8192^3", "fp8"), ("1x2x3", "fp8")]
    with pytest.raises(ValueError, match="--precisions applies only with --gemm-shapes"):
        chosen_gemm_targets(None, ["fp16"])
    with pytest.raises(ValueError, match=r"--precisions.*fp32"):
        chosen_gemm_targets(["8192^3"], ["bf16", "fp32"])
    with pytest.raises(ValueError, match="MxNxK"):
        chosen_gemm_targets(["8192x4096"], None)
