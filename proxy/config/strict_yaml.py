"""Reads the config file's YAML strictly, so what the operator wrote is what
the proxy gets: a key written twice is an error naming it (PyYAML keeps the
last one silently), and scalars follow YAML 1.2's core schema, as Kafka's own
``ConfigDef`` would read them: only ``true``/``false`` are booleans (YAML 1.1
also turns ``yes``, ``on``, ``y`` and ``off`` into booleans), and only plain
decimal numbers are integers (no ``010`` octal, ``0x10``, ``1_000`` or
sexagesimal ``1:30``). Everything else stays a string, for the config's strict
types to refuse with a message.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["StrictYamlError", "read_yaml"]

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"


class StrictYamlError(ValueError):
    """The text is not YAML, or says something twice; one line per problem."""


class _StrictLoader(yaml.CSafeLoader):
    """PyYAML's safe loader on libyaml's parser (in PyYAML's wheels; 5x faster than the
    pure-Python one), with YAML 1.2 core-schema booleans and integers."""


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
# A leading zero stays a string: SafeLoader would read 010 as octal 8.
_StrictLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _duplicates(root: Node) -> list[str]:
    """Every key written twice in one mapping, as ``path: duplicate key (lines a and b)``.
    Iterative, and each node visited once: anchors and aliases share nodes."""
    problems: list[tuple[int, str]] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, MappingNode):
            first_line: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                child = path
                if isinstance(key, ScalarNode):
                    child = _path(path, key.value)
                    marker = (key.tag, key.value)
                    line = key.start_mark.line + 1
                    if marker in first_line:
                        problems.append(
                            (
                                line,
                                f"{child}: duplicate key (lines {first_line[marker]} and {line}); "
                                "YAML would keep only the last, so write it once",
                            )
                        )
                    else:
                        first_line[marker] = line
                stack.append((value, child))
        elif isinstance(node, SequenceNode):
            stack.extend((item, _path(path, i)) for i, item in enumerate(node.value))
    return [problem for _, problem in sorted(problems)]


def _where(exc: yaml.YAMLError, source: str) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{source} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else source


def read_yaml(text: str, source: str) -> Any:
    """The one YAML document in ``text``; ``source`` names it in errors (a file name)."""
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            duplicates = _duplicates(node) if node is not None else []
            if duplicates:
                raise StrictYamlError("\n".join(duplicates))
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise StrictYamlError(f"{_where(exc, source)}: not valid YAML: {problem}") from None
    except RecursionError:
        raise StrictYamlError(f"{source}: not a config: nested too deeply") from None
