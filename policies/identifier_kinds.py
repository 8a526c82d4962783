"""The kinds of identifier KIP-1233 limits, and the property that sets each kind's limit.

Apart from :mod:`policies.identifier_limits`, which imports the protocol codec (kio) for its error codes:
the policy-impact report names limits by these and loads no codec (pipeline.limits).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from policies.properties import (
    CLASSIC_MEMBER_ID_MAX_LENGTH,
    MEMBER_ID_MAX_LENGTH,
    OFFSET_METADATA_MAX_BYTES,
    RESOURCE_IDENTIFIER_MAX_LENGTH,
    TOPIC_NAME_MAX_LENGTH,
)


class IdentifierKind(enum.Enum):
    TOPIC_NAME = "topic name"
    GROUP_ID = "group id"
    MEMBER_ID = "member id"
    CLASSIC_MEMBER_ID = "classic member id"
    GROUP_INSTANCE_ID = "group instance id"
    CLIENT_ID = "client id"
    TRANSACTIONAL_ID = "transactional id"
    RACK_ID = "rack id"
    RESOURCE_NAME = "resource name"
    PRINCIPAL = "ACL principal"
    HOST = "ACL host"
    OFFSET_METADATA = "offset commit metadata"


# The property that sets each kind's limit (for messages and docs).
LIMIT_KEYS: Final[Mapping[IdentifierKind, str]] = {
    IdentifierKind.TOPIC_NAME: TOPIC_NAME_MAX_LENGTH,
    IdentifierKind.MEMBER_ID: MEMBER_ID_MAX_LENGTH,
    IdentifierKind.CLASSIC_MEMBER_ID: CLASSIC_MEMBER_ID_MAX_LENGTH,
    IdentifierKind.OFFSET_METADATA: OFFSET_METADATA_MAX_BYTES,
    **{
        kind: RESOURCE_IDENTIFIER_MAX_LENGTH
        for kind in (
            IdentifierKind.GROUP_ID,
            IdentifierKind.GROUP_INSTANCE_ID,
            IdentifierKind.CLIENT_ID,
            IdentifierKind.TRANSACTIONAL_ID,
            IdentifierKind.RACK_ID,
            IdentifierKind.RESOURCE_NAME,
            IdentifierKind.PRINCIPAL,
            IdentifierKind.HOST,
        )
    },
}


__all__ = ["LIMIT_KEYS", "IdentifierKind"]
