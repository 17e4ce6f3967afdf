"""YAML for files people write by hand: safe, bounded, and a duplicate key is an error.

Owns :class:`StrictLoader`, a ``yaml.SafeLoader`` that refuses a mapping with the same
key twice (PyYAML keeps the last one silently, so a policy or an attach file with two
``rules:`` would lose one without a word; the error carries the key's line and column),
and :func:`load_bounded`, the one way hand-written YAML is read: the text's size, the
nesting depth, the number of aliases and the number of nodes *as expanded* (an alias
counts the whole subtree it names, so a "billion laughs" document is refused while it is
composed, before any object is built) are bounded, each with a :class:`YAMLLimitError`
naming the bound. Used by the remediation policy loader (and its Job templates), the
agent's attach-file loader and the kubeconfig loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["TEMPLATE_YAML", "StrictLoader", "YAMLLimitError", "YAMLLimits", "load_bounded"]


class YAMLLimitError(yaml.YAMLError):
    """A document over one of :class:`YAMLLimits`; the text names the bound."""


@dataclass(frozen=True)
class YAMLLimits:
    """Bounds on one document (defaults fit a policy, a kubeconfig or a Job template)."""

    #: Characters of text.
    max_chars: int = 1 << 20
    #: Collections inside collections.
    max_depth: int = 64
    #: Aliases (``*name``) in the document.
    max_aliases: int = 100
    #: Nodes with every alias expanded (what building the objects would touch).
    max_nodes: int = 200_000


#: Bounds on a repair Job template given as text inside a policy.
TEMPLATE_YAML = YAMLLimits(max_chars=256 * 1024, max_depth=32, max_aliases=50, max_nodes=20_000)


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


class _BoundedLoader(StrictLoader):
    """:class:`StrictLoader` that counts depth, aliases and expanded nodes as it composes."""

    limits = YAMLLimits()

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._total = 0
        #: id(node) -> its size with aliases expanded (nodes an alias names are done).
        self._size: dict[int, int] = {}

    def _over(self, what: str, limit: int) -> YAMLLimitError:
        mark = self.peek_event().start_mark if self.check_event() else None  # type: ignore[no-untyped-call]
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        return YAMLLimitError(f"{what} (at most {limit}){where}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        lim = self.limits
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > lim.max_aliases:
                raise self._over("too many aliases", lim.max_aliases)
        elif self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            self._depth += 1
            if self._depth > lim.max_depth:
                raise self._over("the document is nested too deep", lim.max_depth)
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.CollectionNode):
            if id(node) not in self._size:  # a new collection, not an alias of one
                self._depth -= 1
                if isinstance(node, yaml.MappingNode):
                    children = [n for pair in node.value for n in pair]
                else:
                    children = list(node.value)
                # a child still being composed (a recursive alias) has no size yet
                if any(id(c) not in self._size and isinstance(c, yaml.CollectionNode)
                       for c in children):  # fmt: skip
                    raise YAMLLimitError("an alias refers to a collection that contains it")
                self._size[id(node)] = 1 + sum(self._size.get(id(c), 1) for c in children)
                size = self._size[id(node)]
                self._total += 1  # the node's own children were counted as they came
            else:
                size = self._size[id(node)]
                self._total += size  # an alias: the whole subtree again
        else:
            self._total += 1
        if self._total > lim.max_nodes or (
            isinstance(node, yaml.CollectionNode) and self._size.get(id(node), 0) > lim.max_nodes
        ):
            raise self._over(
                "the document has too many nodes with its aliases expanded (an alias bomb?)",
                lim.max_nodes,
            )
        return node


def load_bounded(text: str, limits: YAMLLimits = YAMLLimits()) -> Any:
    """Parse one YAML document of ``text`` within ``limits`` (duplicate keys refused).

    Raises ``yaml.YAMLError`` (a :class:`YAMLLimitError` for a bound) naming the problem.
    """
    if len(text) > limits.max_chars:
        raise YAMLLimitError(f"the text is larger than {limits.max_chars} characters")
    loader = type("_Loader", (_BoundedLoader,), {"limits": limits})(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YAMLLimitError("the document is nested too deep") from None
    finally:
        loader.dispose()
