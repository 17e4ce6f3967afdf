"""YAML for files people write by hand: safe, and a duplicate key is an error.

Owns :class:`StrictLoader`, a ``yaml.SafeLoader`` that refuses a mapping with the same
key twice (PyYAML keeps the last one silently, so a policy or an attach file with two
``rules:`` would lose one without a word). The error carries the key's line and
column. Used by the remediation policy loader and the agent's attach-file loader.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["StrictLoader"]


class StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
