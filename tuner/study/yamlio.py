"""YAML and JSON loading that refuses duplicate keys (PyYAML silently keeps the last one), and values made JSON-safe."""

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
    """Parse YAML (a superset of JSON), refusing duplicate keys."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except DuplicateKeyError as exc:
        raise DuplicateKeyError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML/JSON: {exc}") from None


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
