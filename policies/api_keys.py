"""Kafka API keys, the one home for them (policies and the proxy shell import these).

Plain ``int`` constants, not an enum: they are compared on every request, and an
enum member lookup costs far more than a module global on Python 3.11. Each name is
kio's API name upper-cased; ``tests/unit/test_api_keys.py`` holds them against kio.
Error codes are kio's own ``kio.schema.errors.ErrorCode``.
"""

from __future__ import annotations

from typing import Final

PRODUCE: Final = 0
FETCH: Final = 1
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
INIT_PRODUCER_ID: Final = 22
ADD_PARTITIONS_TO_TXN: Final = 24
ADD_OFFSETS_TO_TXN: Final = 25
END_TXN: Final = 26
TXN_OFFSET_COMMIT: Final = 28
DESCRIBE_ACLS: Final = 29
CREATE_ACLS: Final = 30
DELETE_ACLS: Final = 31
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
SASL_AUTHENTICATE: Final = 36
DELETE_GROUPS: Final = 42
INCREMENTAL_ALTER_CONFIGS: Final = 44
OFFSET_DELETE: Final = 47
DESCRIBE_CLUSTER: Final = 60
DESCRIBE_TRANSACTIONS: Final = 65
CONSUMER_GROUP_HEARTBEAT: Final = 68
CONSUMER_GROUP_DESCRIBE: Final = 69
SHARE_GROUP_HEARTBEAT: Final = 76
SHARE_GROUP_DESCRIBE: Final = 77
SHARE_FETCH: Final = 78
SHARE_ACKNOWLEDGE: Final = 79
INITIALIZE_SHARE_GROUP_STATE: Final = 83
READ_SHARE_GROUP_STATE: Final = 84
WRITE_SHARE_GROUP_STATE: Final = 85
DELETE_SHARE_GROUP_STATE: Final = 86
READ_SHARE_GROUP_STATE_SUMMARY: Final = 87
STREAMS_GROUP_HEARTBEAT: Final = 88
STREAMS_GROUP_DESCRIBE: Final = 89
DESCRIBE_SHARE_GROUP_OFFSETS: Final = 90
ALTER_SHARE_GROUP_OFFSETS: Final = 91
DELETE_SHARE_GROUP_OFFSETS: Final = 92

INT_MAX: Final = 2_147_483_647
"""Java's Integer.MAX_VALUE: Kafka's default for the limits that are off by default."""
