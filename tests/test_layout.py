"""The package layout as a static import graph (read with ``ast``, nothing imported): no import cycle, the
layers of ``tuner/`` point down only, ``tuner/`` imports neither ``api/`` nor ``objectives/``, ``kernels/``
imports only torch, triton, the standard library and itself, and ``tuner/`` keeps at most 12 modules of its own.

The graph counts every import of a module, at module level and inside functions alike (a lazy import is
still a dependency: it only moves the cycle from import time to call time)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tuner", "api", "objectives", "models", "kernels")

#: The project's top-level packages, lowest first: each may import only those before it (and itself).
PROJECT_LAYERS = ("kernels", "tuner", "models", "objectives", "api")
#: tuner's packages, lowest first; those of one layer may import each other (without a cycle).
TUNER_LAYERS = (
    ("study",),
    ("store",),
    ("strategy", "workloads", "results", "best_configs"),
    ("run",),
    ("cli",),
)
#: Upward imports inside tuner that the layering still has, each with what removes it. The list only
#: shrinks: a new upward import fails, and so does an entry that is no longer needed.
KNOWN_UPWARD = {
    # a spec is checked against its workload's declared contract (args, metrics, static feasibility)
    "tuner.study.spec -> tuner.workloads.base": "the spec checks move above workloads",
    "tuner.study.spec -> tuner.workloads.registry": "the spec checks move above workloads",
    # the API's trial filters name the statuses and the metrics a workload declares
    "tuner.store.queries -> tuner.workloads.base": "statuses and metric names stored with the study",
    "tuner.store.queries -> tuner.workloads.registry": "statuses and metric names stored with the study",
    # the registry's recheck measures an entry again with a trial worker
    "tuner.best_configs.recheck -> tuner.run.worker": "the recheck job moves into tuner.run",
}
KERNEL_DEPENDENCIES = {"torch", "triton", "kernels", "__future__"}
MAX_TUNER_MODULES = 12


def module_name(path: Path, root: Path) -> str:
    """``tuner/store/storage.py`` -> ``tuner.store.storage``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages under ``root``, by dotted name."""
    return {
        module_name(path, root): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def imported_names(path: Path, name: str) -> set[str]:
    """The dotted names ``path`` (module ``name``) imports anywhere in it: ``import a.b`` gives ``a.b``,
    ``from a import b`` gives ``a.b`` (a module or a name in ``a``; :func:`import_graph` tells which)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is or lies in (``tuner.store.storage.StudyDB`` -> ``tuner.store.storage``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(edges, external)``: the project modules each module imports, and the other names it imports."""
    modules = project_modules(root)
    edges: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = imported_names(path, name)
        edges[name] = {t for t in map(lambda n: resolve(n, modules), targets) if t is not None and t != name}
        external[name] = {t for t in targets if resolve(t, modules) is None}
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for node in sorted(edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def tuner_layer(module: str) -> int | None:
    """The layer of a module of a ``tuner`` package (:data:`TUNER_LAYERS`); None for tuner's own modules."""
    parts = module.split(".")
    if parts[0] != "tuner" or len(parts) < 2:
        return None
    for level, packages in enumerate(TUNER_LAYERS):
        if parts[1] in packages:
            return level
    return None


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every import that points to a higher layer: between the project's packages and inside tuner."""
    found = []
    for source, targets in edges.items():
        for target in targets:
            top_source, top_target = source.split(".")[0], target.split(".")[0]
            if PROJECT_LAYERS.index(top_target) > PROJECT_LAYERS.index(top_source):
                found.append(f"{source} -> {target}")
                continue
            low, high = tuner_layer(source), tuner_layer(target)
            if low is not None and high is not None and high > low:
                found.append(f"{source} -> {target}")
    return sorted(found)


def layout_problems(root: Path = ROOT) -> dict[str, list[str]]:
    """Every rule the layout breaks under ``root``, by rule (empty lists: none)."""
    edges, external = import_graph(root)
    tuner_edges = {s: {t for t in ts if t.startswith("tuner")} for s, ts in edges.items() if s.startswith("tuner")}
    stdlib = set(sys.stdlib_module_names)
    return {
        "cycles among tuner modules": [" <-> ".join(c) for c in cycles(tuner_edges)],
        "cycles among project modules": [" <-> ".join(c) for c in cycles(edges)],
        "kernels importing beyond torch, triton, the standard library": sorted(
            f"{source} -> {name}"
            for source, names in external.items()
            if source.split(".")[0] == "kernels"
            for name in names | {t for t in edges[source] if not t.startswith("kernels")}
            if name.split(".")[0] not in KERNEL_DEPENDENCIES | stdlib
        ),
        "tuner importing api or objectives": sorted(
            f"{source} -> {target}"
            for source, targets in edges.items()
            if source.split(".")[0] == "tuner"
            for target in targets
            if target.split(".")[0] in ("api", "objectives")
        ),
        "upward imports": [i for i in upward_imports(edges) if i not in KNOWN_UPWARD],
        "known upward imports that are gone (drop them from KNOWN_UPWARD)": sorted(
            set(KNOWN_UPWARD) - set(upward_imports(edges))
        ),
        f"more than {MAX_TUNER_MODULES} modules directly in tuner/": (
            [str(len(direct))] if len(direct := sorted((root / "tuner").glob("*.py"))) > MAX_TUNER_MODULES else []
        ),
    }


def test_the_graph_sees_imports_inside_functions_and_relative_ones(tmp_path) -> None:
    (tmp_path / "tuner" / "run").mkdir(parents=True)
    (tmp_path / "tuner" / "cli").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "tuner" / "run" / "__init__.py").write_text("")
    (tmp_path / "tuner" / "run" / "a.py").write_text("def f():\n    from tuner.cli import b\n")
    (tmp_path / "tuner" / "cli" / "__init__.py").write_text("")
    (tmp_path / "tuner" / "cli" / "b.py").write_text("from ..run.a import f\n")
    (tmp_path / "kernels" / "k.py").write_text("import os\nimport numpy\nfrom tuner.run import a\n")
    edges, external = import_graph(tmp_path)
    assert edges["tuner.run.a"] == {"tuner.cli.b"}
    assert edges["tuner.cli.b"] == {"tuner.run.a"}
    assert external["kernels.k"] == {"os", "numpy"}
    problems = layout_problems(tmp_path)
    assert problems["cycles among tuner modules"] == ["tuner.cli.b <-> tuner.run.a"]
    assert problems["upward imports"] == ["kernels.k -> tuner.run.a", "tuner.run.a -> tuner.cli.b"]
    assert problems["kernels importing beyond torch, triton, the standard library"] == [
        "kernels.k -> numpy",
        "kernels.k -> tuner.run.a",
    ]


@pytest.mark.parametrize("rule", list(layout_problems()))
def test_the_layout_keeps_its_rules(rule: str) -> None:
    assert layout_problems()[rule] == []


def test_every_package_says_what_it_holds() -> None:
    packages = [path for top in ("tuner", "kernels") for path in sorted((ROOT / top).iterdir()) if path.is_dir()]
    packages = [path for path in packages if path.name != "__pycache__"]
    assert len(packages) >= 13  # tuner's eight packages and the five kernel families
    for package in packages:
        init = package / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), f"{package.name}: no docstring"
