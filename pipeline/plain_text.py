"""Identifiers from the wire (client ids, group ids, ...) as plain, printable text.

Kafka puts no rule on the characters of a client or group id, so a control
character can reach the report: one in a YAML comment makes the file unloadable,
one in an SVG text makes the plot's XML ill-formed. Each output escapes what is
not printable as Python's ``repr`` does (``\\x01``), and markup the way its format needs.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (``\\x01``, ``\\u2028``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
