"""YAML and JSON loading that refuses duplicate keys (PyYAML silently keeps the last one) and YAML whose
aliases expand beyond a bound (an alias bomb: a few hundred bytes that stand for billions of nodes)."""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import yaml


class DuplicateKeyError(ValueError):
    pass


class _StrictLoader(yaml.SafeLoader):
    pass


#: Nodes a document's aliases may add once expanded (what walking the loaded data visits beyond the nodes the
#: text itself has); a document past it is refused before anything is constructed.
MAX_ALIAS_NODES = 100_000


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a composed document whose aliases expand to more than :data:`MAX_ALIAS_NODES` extra nodes, or
    that holds itself (a recursive alias). Each distinct node is sized once (aliases share nodes), so this is
    linear in the text."""
    size: dict[int, int] = {}  # a node's size expanded; -1 while the nodes below it are sized
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, below_sized = stack.pop()
        if below_sized:
            size[id(node)] = 1 + sum(size[id(child)] for child in _children(node))
            # the whole document's extra nodes are at least this node's size less every node seen yet
            if size[id(node)] - len(size) > MAX_ALIAS_NODES:
                raise ValueError(
                    f"{source}: its aliases expand to more than {MAX_ALIAS_NODES} nodes beyond its own "
                    "(an alias bomb?); write the values out"
                )
            continue
        if size.get(id(node)) == -1:
            raise ValueError(f"{source}: a recursive alias (a node that holds itself)")
        if id(node) not in size:
            size[id(node)] = -1
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise DuplicateKeyError(f"duplicate key {key!r} (line {mark.line + 1}, column {mark.column + 1})")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, source: str = "<string>") -> Any:
    """Parse YAML (a superset of JSON), refusing duplicate keys, aliases that expand past
    :data:`MAX_ALIAS_NODES` and recursive ones (before constructing anything)."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source)
        return loader.construct_document(node)
    except DuplicateKeyError as exc:
        raise DuplicateKeyError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML/JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


def load_json_text(text: str, source: str = "<string>") -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        dupes = {k for k in keys if keys.count(k) > 1}
        if dupes:
            raise DuplicateKeyError(f"{source}: duplicate key {sorted(dupes)[0]!r}")
        return dict(items)

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON: {exc}") from None


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def json_safe(value: Any) -> Any:
    """``value`` with only JSON types: NaN/inf become None, tuples lists, other objects their ``str``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return str(value)
