"""Small expressions parsed against an allow-list: never ``eval``.

Used for three things: spec constraints (``max_rel_error <= 0.05``), the
``when`` conditions of conditional parameters (``weight_bits < 16``) and the
static feasibility rules of search spaces
(``num_stages * (BLOCK_M * BLOCK_K) * bytes_per_element(precision) <= device.smem_per_block_bytes``).

The text is parsed with :mod:`ast` and every node is checked against an
allow-list: numbers, strings, names, ``device.<field>``, arithmetic, comparisons,
``and``/``or``/``not``, and calls of a few named functions. Evaluation walks
the checked tree itself.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


def bytes_per_element(precision: str) -> float:
    try:
        return _BYTES_PER_ELEMENT[precision]
    except KeyError:
        raise ExpressionError(f"bytes_per_element: unknown precision {precision!r}") from None


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "log2": math.log2,
    "ceil": math.ceil,
    "floor": math.floor,
    "bytes_per_element": bytes_per_element,
}

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
MAX_LENGTH = 500


class ExpressionError(ValueError):
    """An expression that is not allowed, or that cannot be evaluated."""


class Unknown(Exception):
    """Raised during evaluation when a ``device.<field>`` the expression needs is null."""


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression and the names it reads."""

    text: str
    tree: ast.expr
    names: frozenset[str]
    device_fields: frozenset[str]

    def evaluate(self, names: Mapping[str, Any], device: Mapping[str, Any] | None = None) -> Any:
        """Evaluate with ``names`` bound; raises :class:`Unknown` if a needed device field is null."""
        return _Evaluator(names, device or {}).visit(self.tree)


def parse(text: str, *, allow_device: bool = False, allow_calls: bool = True) -> Expression:
    """Parse ``text`` and check every node against the allow-list."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse {text!r}: {exc.msg}") from None
    names: set[str] = set()
    device_fields: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id == "device" and not allow_device:
                raise ExpressionError(f"{text!r}: 'device' is not available here")
            if node.id not in FUNCTIONS and node.id != "device":
                names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if not (allow_device and isinstance(node.value, ast.Name) and node.value.id == "device"):
                raise ExpressionError(f"{text!r}: attribute access is allowed only as device.<field>")
            device_fields.add(node.attr)
        elif isinstance(node, ast.Call):
            if not allow_calls:
                raise ExpressionError(f"{text!r}: function calls are not allowed here")
            if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
                raise ExpressionError(f"{text!r}: only calls of {sorted(FUNCTIONS)} are allowed")
            if node.keywords:
                raise ExpressionError(f"{text!r}: keyword arguments are not allowed")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise ExpressionError(f"{text!r}: constant {node.value!r} is not allowed")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise ExpressionError(f"{text!r}: operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.Compare):
            if any(type(op) not in _CMPOPS for op in node.ops):
                raise ExpressionError(f"{text!r}: only < <= > >= == != comparisons are allowed")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                raise ExpressionError(f"{text!r}: unary {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.BoolOp):
            pass
        elif isinstance(node, (ast.Load, ast.operator, ast.cmpop, ast.boolop, ast.unaryop)):
            pass
        else:
            raise ExpressionError(f"{text!r}: {type(node).__name__} is not allowed")
    return Expression(text.strip(), tree, frozenset(names), frozenset(device_fields))


class _Evaluator(ast.NodeVisitor):
    def __init__(self, names: Mapping[str, Any], device: Mapping[str, Any]) -> None:
        self.names = names
        self.device = device

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        try:
            return self.names[node.id]
        except KeyError:
            raise ExpressionError(f"unknown name {node.id!r}") from None

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        value = self.device.get(node.attr)
        if value is None:
            raise Unknown(node.attr)
        return value

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        return _BINOPS[type(node.op)](self.visit(node.left), self.visit(node.right))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        if isinstance(node.op, ast.And):
            return all(self.visit(v) for v in node.values)
        return any(self.visit(v) for v in node.values)

    def visit_Compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.visit(comparator)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True

    def visit_Call(self, node: ast.Call) -> Any:
        func = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
        return func(*(self.visit(a) for a in node.args))

    def generic_visit(self, node: ast.AST) -> Any:  # pragma: no cover - parse() rejects these
        raise ExpressionError(f"{type(node).__name__} is not allowed")


@dataclass(frozen=True)
class Constraint:
    """``metric <op> bound``: a comparison of a metric with a number or another metric."""

    text: str
    left: str
    op: str
    right: str | float

    def violation(self, metrics: Mapping[str, float]) -> float:
        """How far ``metrics`` are from satisfying the constraint: <= 0 satisfied, > 0 violated.

        A missing or NaN metric counts as violated (1.0).
        """
        lhs = metrics.get(self.left)
        rhs = metrics.get(self.right) if isinstance(self.right, str) else self.right
        if lhs is None or rhs is None or _not_finite(lhs) or _not_finite(rhs):
            return 1.0
        if self.op in ("<=", "<"):
            gap = lhs - rhs
        elif self.op in (">=", ">"):
            gap = rhs - lhs
        else:  # ==
            gap = abs(lhs - rhs)
        if self.op in ("<", ">") and gap == 0:
            return 1e-12
        return float(gap)

    def satisfied(self, metrics: Mapping[str, float]) -> bool:
        return self.violation(metrics) <= 0


def _not_finite(x: float) -> bool:
    return not math.isfinite(x)


def parse_constraint(text: str, known_metrics: set[str]) -> Constraint:
    """Parse ``metric <op> number`` or ``metric <op> metric``; the metrics must be known."""
    expr = parse(text, allow_calls=False)
    tree = expr.tree
    if not isinstance(tree, ast.Compare) or len(tree.ops) != 1:
        raise ExpressionError(f"constraint {text!r} is not a single comparison such as 'max_rel_error <= 0.05'")
    op = type(tree.ops[0])
    if op not in (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq):
        raise ExpressionError(f"constraint {text!r}: use one of < <= > >= ==")
    left, right = tree.left, tree.comparators[0]
    flipped = False
    if not isinstance(left, ast.Name) and isinstance(right, ast.Name):
        left, right, flipped = right, left, True
    if not isinstance(left, ast.Name):
        raise ExpressionError(f"constraint {text!r}: one side must be a metric name")
    bound: str | float
    if isinstance(right, ast.Name):
        bound = right.id
    else:
        try:
            bound = float(_Evaluator({}, {}).visit(right))
        except (ExpressionError, TypeError, ValueError):
            raise ExpressionError(f"constraint {text!r}: the bound must be a number or a metric") from None
    for name in (left.id, bound):
        if isinstance(name, str) and name not in known_metrics:
            raise ExpressionError(
                f"constraint {text!r}: unknown metric {name!r}; known: {', '.join(sorted(known_metrics))}"
            )
    op_text = _CMP_TEXT[op]
    if flipped:
        op_text = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}[op_text]
    return Constraint(text=text, left=left.id, op=op_text, right=bound)
