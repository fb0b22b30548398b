"""Every project name the benchmark scripts import exists.

The scripts import lazily, inside functions, so that ``--help`` works without a GPU; a
renamed or removed function would otherwise surface only on the GPU machine.
"""

from __future__ import annotations

import ast
import importlib
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
    assert ("kernels.gemm", "max_rel_error") in {(m, n) for _, m, n in imports}


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
