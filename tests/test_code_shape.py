"""The shape the project keeps its engine and service code in: no module in ``tuner/`` or ``api/`` over
600 lines and no function over 60 (decorators and docstring included), so each stays readable whole."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for d in ("tuner", "api") for p in (REPO / d).rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules: {long}"


def test_no_function_is_over_60_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if (length := node.end_lineno - start + 1) > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = length
    assert not long, f"split these functions: {long}"


MAX_JS_LINES = 800
MAX_JS_FUNCTION_LINES = 150
_JS_START = re.compile(r"^(export )?(async )?function |^(export )?const \w+ = (async )?(\(.*\)|\w+) =>")


def _js_functions(path: Path) -> dict[str, int]:
    """Each top-level function of a dashboard module and its length in lines (nested ones lie inside it):
    from its first line to the first line at column 0 that closes a block."""
    lines = path.read_text().splitlines()
    out, start = {}, None
    for i, line in enumerate(lines):
        if start is None and _JS_START.match(line):
            start = i
            if line.rstrip().endswith(";"):  # a one-line arrow
                out[f"{path.name}:{i + 1}"], start = 1, None
        elif start is not None and re.match(r"^[})\]]", line):
            out[f"{path.name}:{start + 1}"], start = i - start + 1, None
    return out


def test_no_dashboard_module_is_over_800_lines_nor_function_over_150() -> None:
    modules = sorted((REPO / "api" / "static" / "js").glob("*.js"))
    assert modules, "the dashboard's modules are in api/static/js"
    long = {p.name: n for p in modules if (n := len(p.read_text().splitlines())) > MAX_JS_LINES}
    assert not long, f"split these modules: {long}"
    functions = {k: n for p in modules for k, n in _js_functions(p).items()}
    assert len(functions) > 50, "the function finder finds the modules' functions"
    long = {k: n for k, n in functions.items() if n > MAX_JS_FUNCTION_LINES}
    assert not long, f"split these functions: {long}"
