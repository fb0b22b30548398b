"""Small expressions parsed against an allow-list: never ``eval``.

Used for three things: spec constraints (``max_rel_error <= 0.05``), the
``when`` conditions of conditional parameters (``weight_bits < 16``) and the
static feasibility rules of search spaces
(``num_stages * (BLOCK_M * BLOCK_K) * bytes_per_element(precision) <= device.smem_per_block_bytes``).

The text is parsed with :mod:`ast` and every node is checked against an
allow-list: numbers, strings, names, ``device.<field>``, arithmetic, comparisons,
``and``/``or``/``not``, and calls of a few named functions. Evaluation walks
the checked tree itself.

Evaluation is bounded, because the text comes from requests: an int result may have at most
:data:`MAX_INT_BITS` bits and a string at most :data:`MAX_STR_CHARS` characters (checked before
``**``, ``*`` compute, so ``3**(3*10**7)`` or ``'a' * 10**20`` cost nothing), ``%`` works on numbers
only, and every arithmetic failure (division by zero, overflow, mixing a string with a number,
comparing them) is an :class:`ExpressionError`. Parts of an expression that read no name are
evaluated once at parse time, so ``1/0 > 0`` is refused when it is submitted.
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
#: Largest int an expression may compute, in bits (a shared-memory or FLOP count needs < 64).
MAX_INT_BITS = 1024
#: Longest string an expression may compute.
MAX_STR_CHARS = 10_000
#: What an evaluation may raise besides our own errors: all of them mean "this expression fails here".
_EVAL_ERRORS = (ArithmeticError, TypeError, ValueError, KeyError, RecursionError)


class ExpressionError(ValueError):
    """An expression that is not allowed, or that cannot be evaluated."""


class UnknownName(ExpressionError):
    """Evaluation read a name that is not bound (e.g. a conditional param that is inactive)."""


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
        """Evaluate with ``names`` bound; raises :class:`Unknown` if a needed device field is null and
        :class:`ExpressionError` (:class:`UnknownName` for an unbound name) if it cannot be evaluated."""
        return _evaluate(self.text, self.tree, names, device or {})


def _evaluate(text: str, tree: ast.expr, names: Mapping[str, Any], device: Mapping[str, Any]) -> Any:
    try:
        return _Evaluator(names, device).visit(tree)
    except UnknownName:
        raise
    except ExpressionError as exc:
        raise ExpressionError(f"{text!r} cannot be evaluated: {exc}") from None
    except _EVAL_ERRORS as exc:
        raise ExpressionError(f"{text!r} cannot be evaluated: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return f"{type(exc).__name__}: {exc}"


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
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise ExpressionError(f"{text!r}: numbers must be finite, got {node.value!r}")
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
    _fold_constants(text, tree)
    return Expression(text.strip(), tree, frozenset(names), frozenset(device_fields))


def _fold_constants(text: str, tree: ast.expr) -> None:
    """Evaluate once every largest part of ``tree`` that reads no name: its errors are the text's errors."""

    def reads_nothing(node: ast.AST) -> bool:
        if isinstance(node, (ast.Name, ast.Attribute)):
            return False
        children = node.args if isinstance(node, ast.Call) else ast.iter_child_nodes(node)
        # all() over a list, not a generator: every child is visited, so every constant part is folded
        return all([reads_nothing(child) for child in children])

    def fold(node: ast.AST) -> None:
        if isinstance(node, ast.expr) and not isinstance(node, ast.Constant) and reads_nothing(node):
            _evaluate(text, node, {}, {})
            return
        for child in ast.iter_child_nodes(node):
            fold(child)

    fold(tree)


class _Evaluator(ast.NodeVisitor):
    def __init__(self, names: Mapping[str, Any], device: Mapping[str, Any]) -> None:
        self.names = names
        self.device = device

    def visit_Constant(self, node: ast.Constant) -> Any:
        return _checked(node.value)

    def visit_Name(self, node: ast.Name) -> Any:
        try:
            return self.names[node.id]
        except KeyError:
            raise UnknownName(f"unknown name {node.id!r}") from None

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        value = self.device.get(node.attr)
        if value is None:
            raise Unknown(node.attr)
        return value

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        _check_operands(type(node.op), left, right)
        return _checked(_BINOPS[type(node.op)](left, right))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        if not _is_number(value):
            raise ExpressionError(f"unary - and + need a number, got {value!r}")
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
        return _checked(func(*(self.visit(a) for a in node.args)))

    def generic_visit(self, node: ast.AST) -> Any:  # pragma: no cover - parse() rejects these
        raise ExpressionError(f"{type(node).__name__} is not allowed")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # bool is an int


def _int_bits(value: Any) -> int:
    return abs(int(value)).bit_length() if isinstance(value, int) else 0


def _check_operands(op: type, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be too large, before computing it."""
    if isinstance(left, str) or isinstance(right, str):
        if op is ast.Mult and isinstance(right, str):
            left, right = right, left
        if op is ast.Add and isinstance(left, str) and isinstance(right, str):
            return  # bounded by the operands' lengths, checked after
        if op is ast.Mult and isinstance(left, str) and isinstance(right, int):
            if len(left) * max(right, 0) > MAX_STR_CHARS:
                raise ExpressionError(f"a string longer than {MAX_STR_CHARS} characters")
            return
        raise ExpressionError(f"{type(left).__name__} {_OP_TEXT[op]} {type(right).__name__} is not allowed")
    if not (_is_number(left) and _is_number(right)):
        raise ExpressionError(f"arithmetic needs numbers, got {left!r} and {right!r}")
    if op is ast.Mult and _int_bits(left) + _int_bits(right) > MAX_INT_BITS + 1:
        raise ExpressionError(f"an integer larger than 2**{MAX_INT_BITS}")
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if _int_bits(left) - 1 > MAX_INT_BITS // right:  # (bits - 1) * right bounds the result's bits from below
            raise ExpressionError(f"an integer larger than 2**{MAX_INT_BITS}")


def _checked(value: Any) -> Any:
    """The value if it is a number, bool or string within the limits."""
    if isinstance(value, bool) or isinstance(value, float):
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise ExpressionError(f"an integer larger than 2**{MAX_INT_BITS}")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STR_CHARS:
            raise ExpressionError(f"a string longer than {MAX_STR_CHARS} characters")
        return value
    raise ExpressionError(f"a {type(value).__name__} result is not allowed")  # e.g. complex from (-8) ** 0.5


_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


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
            bound = float(_evaluate(text, right, {}, {}))
        except (ExpressionError, TypeError, ValueError, OverflowError):
            raise ExpressionError(f"constraint {text!r}: the bound must be a number or a metric") from None
        if not math.isfinite(bound):
            raise ExpressionError(f"constraint {text!r}: the bound must be a finite number")
    for name in (left.id, bound):
        if isinstance(name, str) and name not in known_metrics:
            raise ExpressionError(
                f"constraint {text!r}: unknown metric {name!r}; known: {', '.join(sorted(known_metrics))}"
            )
    op_text = _CMP_TEXT[op]
    if flipped:
        op_text = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}[op_text]
    return Constraint(text=text, left=left.id, op=op_text, right=bound)
