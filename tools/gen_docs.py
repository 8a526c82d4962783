"""Writes the generated parts of docs/: the config reference in docs/config.md from the config
model (proxy/config/model.py: keys, types, defaults, constraints, Field descriptions), and the metrics
reference in docs/metrics.md from a proxy's live prometheus-client registry (every family:
name, type, labels, help). Each part sits between a BEGIN and an END marker; the prose around
it is written by hand.

    .venv/bin/python tools/gen_docs.py           # rewrite the generated parts (make docs)
    .venv/bin/python tools/gen_docs.py --check   # exit 1 naming each stale file

tests/unit/test_docs.py fails while either file is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import trio
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config.model import Config, ListenerPolicies, parse_config  # noqa: E402
from proxy.serve.server import ProxyServer  # noqa: E402

CONFIG_DOC = ROOT / "docs" / "config.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"


def begin_marker(part: str) -> str:
    return f"<!-- BEGIN GENERATED {part}: tools/gen_docs.py writes this part (make docs); do not edit it -->"


def end_marker(part: str) -> str:
    return f"<!-- END GENERATED {part} -->"


def cell(text: str) -> str:
    """Text safe in one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def prose(text: str) -> str:
    """Free text in a table cell: ``<listener>`` shown, not taken for an HTML tag."""
    return cell(text).replace("<", "&lt;")


# ---- the config reference -------------------------------------------------------------------


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_name(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in get_args(annotation))
    if origin is Literal:
        return " or ".join(f"`{value}`" for value in get_args(annotation))
    if origin is tuple:
        return f"list of {type_name(get_args(annotation)[0])}s"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping of {type_name(key)} to {type_name(value)}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


_SIGNS = (
    (annotated_types.Ge, ">=", "ge"),
    (annotated_types.Gt, ">", "gt"),
    (annotated_types.Le, "<=", "le"),
    (annotated_types.Lt, "<", "lt"),
)


def allowed_text(field: FieldInfo) -> str:
    """The rules the model itself holds a value to (bounds, length, pattern)."""
    rules = []
    for item in field.metadata:
        rules += [f"{sign} {getattr(item, attribute)}" for kind, sign, attribute in _SIGNS if isinstance(item, kind)]
        if isinstance(item, annotated_types.MinLen):
            rules.append(f"at least {item.min_length}")
        if getattr(item, "pattern", None):
            rules.append(f"matches `{item.pattern}`")
    return ", ".join(rules)


def config_sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(path, model) of every section, depth first: ``upstream.tls``, ``listeners[].tls``, ..."""
    yield path, model
    for name, field in model.model_fields.items():
        inner = _model_in(field.annotation)
        if inner is None:
            continue
        key = field.alias or name
        if inner is ListenerPolicies:
            yield from config_sections(inner, f"{path}.listener.name.<listener>")
            continue
        many = get_origin(field.annotation) is tuple
        yield from config_sections(inner, f"{path}.{key}{'[]' if many else ''}".lstrip("."))


def config_reference() -> str:
    lines = []
    for path, model in config_sections(Config, ""):
        if model is ListenerPolicies:
            title = "`policies`: per listener (`listener.name.<listener>.<property>`)"
        else:
            title = f"`{path}`" if path else "Top level"
        lines += [f"### {title}", ""]
        lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            if model is ListenerPolicies:
                key = f"listener.name.<listener>.{key}"
            lines.append(
                f"| `{cell(key)}` | {cell(type_name(field.annotation))} | {cell(default_text(field))} "
                f"| {cell(allowed_text(field))} | {prose(field.description or '')} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---- the metrics reference ------------------------------------------------------------------

# A proxy as small as the model allows: the registry has every family whatever the config.
_MINIMAL_CONFIG = {
    "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
    "listeners": [{"name": "external", "bind": "127.0.0.1:29092"}],
}


def metric_families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name, type, labels, help) of every family a proxy's registry exports, walked inside a
    trio run as a scrape is (some collectors read trio's state)."""
    server = ProxyServer(parse_config(_MINIMAL_CONFIG))
    registry = server.metrics.registry
    families: list[tuple[str, str, tuple[str, ...], str]] = []

    async def walk() -> None:
        # prometheus-client keeps a family's label names in private attributes only: a labelled
        # Counter or Gauge with no child yet collects no sample to read them from.
        for collector in list(registry._collector_to_names):
            if isinstance(collector, MetricWrapperBase):
                families.append(
                    (collector._name, str(collector._type), tuple(collector._labelnames), collector._documentation)
                )
                continue
            for family in collector.collect():
                labels = getattr(family, "_labelnames", None)
                if labels is None:
                    labels = sorted({label for sample in family.samples for label in sample.labels})
                names = tuple(label for label in labels if label != "le")
                families.append((family.name, family.type, names, family.documentation))

    try:
        trio.run(walk)
    finally:
        server.audit.close()  # its writer thread: nothing else of the server ran
    return sorted(families)


def exposed_name(name: str, kind: str) -> str:
    if kind == "counter":
        return f"`{name}_total`"
    if kind == "histogram":
        return f"`{name}` (`_bucket`, `_sum`, `_count`)"
    return f"`{name}`"


def metrics_reference() -> str:
    lines = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for name, kind, labels, help_text in metric_families():
        shown = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| {exposed_name(name, kind)} | {kind} | {shown} | {prose(help_text)} |")
    return "\n".join(lines) + "\n"


# ---- writing --------------------------------------------------------------------------------


def with_part(document: str, part: str, body: str) -> str:
    begin, end = begin_marker(part), end_marker(part)
    head, found, rest = document.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise SystemExit(f"no {begin!r} ... {end!r} in the document")
    return f"{head}{begin}\n\n{body}\n{end}{tail}"


def generated() -> dict[Path, str]:
    """Each generated document as it should be."""
    return {
        CONFIG_DOC: with_part(CONFIG_DOC.read_text(), "config", config_reference()),
        METRICS_DOC: with_part(METRICS_DOC.read_text(), "metrics", metrics_reference()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated part is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for path in stale:
        verb = "is stale (run make docs)" if args.check else "rewritten"
        print(f"{path.relative_to(ROOT)}: {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
