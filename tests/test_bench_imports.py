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
