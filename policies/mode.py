"""Every policy runs in one of two modes: ``enforce`` carries decisions out;
``observe`` (dry run) decides, counts and audits, but lets traffic through."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    ENFORCE = "enforce"
    OBSERVE = "observe"
