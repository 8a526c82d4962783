"""What GitHub makes of a Markdown file's headings and links: the anchors it gives the
headings (github-slugger's rules) and the relative links a page holds, so tests can
check that every link between the README, docs/ and the rules' runbook_urls lands."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}#{1,6} +(.+?)(?: +#+)? *$")
_INLINE_CODE = re.compile(r"`[^`]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(markdown: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation other than - and _
    dropped (backticks included), each space a dash."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def github_anchors(markdown: str) -> set[str]:
    """Every anchor of a document's headings; a repeated one gets -1, -2, ... as on GitHub."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(markdown):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def relative_links(markdown: str) -> list[str]:
    """Targets of the links outside code that point into the repository (no scheme)."""
    targets = []
    for line in prose_lines(markdown):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
                targets.append(target)
    return targets
