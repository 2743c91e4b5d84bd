"""YAML for hostile input: PyYAML's safe loader with limits, and no silent duplicate keys.

- nesting deeper than MAX_DEPTH levels (counted through aliases) is refused before the
  composer recurses into it (a few hundred '[' were a RecursionError);
- aliases may not expand the document beyond MAX_NODES nodes (a 350-byte "billion laughs"
  expanded to gigabytes in validation and in refusal messages), nor refer to themselves;
- integers longer than MAX_NUMBER_DIGITS digits are refused (Python refuses above 4,300
  digits with a ValueError, and 400 digits overflow every float);
- a key given twice in one mapping is refused (the last silently won: a second `queues:`
  block erased the first). Merge keys (`<<: *base`) keep their override semantics.

Refusals carry the position (line, column), the cause, the limit and the fix.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_NUMBER_DIGITS = 30

_MERGE = "tag:yaml.org,2002:merge"


class YamlRefusal(Exception):
    """A document refused by a limit or for a duplicate key, with where, cause and fix."""

    def __init__(self, where: str, cause: str, fix: str) -> None:
        self.where = where
        self.cause = cause
        self.fix = fix
        super().__init__(f"{where}: {cause}")


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(document)"


class _Loader(yaml.SafeLoader):
    """The safe loader with a depth limit in the (recursive) composer."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlRefusal(
                    _where(self.peek_event().start_mark),  # type: ignore[no-untyped-call]
                    f"the document is nested more than {MAX_DEPTH} levels deep",
                    f"a config needs a few levels; keep nesting within {MAX_DEPTH} levels",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the constructor refuses it below
                continue
            if first is not None:
                shown = key if isinstance(key, str) and len(key) <= 60 else str(key)[:60] + "…"
                raise YamlRefusal(
                    _where(key_node.start_mark),
                    f"duplicate key {shown!r} (first at {_where(first.start_mark)}); YAML "
                    "would silently keep only the last one",
                    "merge the two blocks into one, or rename one of the keys",
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = sum(ch.isalnum() for ch in str(node.value))
        if digits > MAX_NUMBER_DIGITS:
            raise YamlRefusal(
                _where(node.start_mark),
                f"a number with {digits} digits (the limit is {MAX_NUMBER_DIGITS} digits)",
                "write a realistic number; every field has its own bound",
            )
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_NUMBER_DIGITS:
            raise YamlRefusal(
                _where(node.start_mark),
                f"a number with {digits} digits (the limit is {MAX_NUMBER_DIGITS} digits)",
                "write a realistic number; every field has its own bound",
            )
        return super().construct_yaml_float(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)


def _check_expansion(root: Node) -> None:
    """Refuse a node graph whose aliases expand it past MAX_NODES nodes or MAX_DEPTH levels,
    or that contains itself. Memoised per node, so the check is linear in the written nodes."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_.discard(key)
            if size[key] > MAX_NODES:
                raise YamlRefusal(
                    _where(node.start_mark),
                    f"aliases expand the document to more than {MAX_NODES:,} values (the "
                    "limit on alias expansion)",
                    "write the values out, or use fewer and smaller aliases",
                )
            if depth[key] > MAX_DEPTH:
                raise YamlRefusal(
                    _where(node.start_mark),
                    f"through its aliases the document is nested more than {MAX_DEPTH} levels deep",
                    f"keep nesting within {MAX_DEPTH} levels",
                )
            continue
        if key in size:
            continue
        if key in open_:
            raise YamlRefusal(
                _where(node.start_mark),
                "an alias refers to the block that contains it (a recursive structure)",
                "remove the alias or point it at another block",
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml(text: str) -> Any:
    """One YAML document, with the limits above; YamlRefusal or yaml.YAMLError otherwise."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        try:
            return loader.construct_document(node)
        except ConstructorError:
            raise
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # e.g. an unhashable key a constructor cannot place in a dict
            raise YamlRefusal(
                "(document)",
                f"cannot be read as data ({type(exc).__name__})",
                "simplify the keys and values: keys are plain words",
            ) from None
    finally:
        loader.dispose()
