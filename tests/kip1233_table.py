"""KIP-1233's identifier limits, written out by hand from the KIP's text
(../shared/seeds/003_02b5c7cdc5b14ce3.txt), per API and request field.

Nothing here is read from ``policies.identifier_limits``: the tests hold the
policy to this table. Every string field of every request kio knows is in
exactly one of :data:`KIP_1233_FIELDS` (checked: kind, limit, error code),
:data:`KIP_1233_NOT_CHECKED` (the KIP names it, the proxy deliberately does not
check it: why) or :data:`NOT_IDENTIFIERS` (not a KIP identifier: why), so a
field new in kio fails the tests until someone decides which.

Paths are kio's field names; ``name[]`` is every element of a collection.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Expected:
    kind: str  # the identifier's row in the KIP's table (IdentifierKind values spell the same)
    limit: int  # characters (Java String.length(), UTF-16 units)
    error_code: int  # what the broker answers for a breach


# The KIP's error codes. RESOURCE_IDENTIFIER_TOO_LARGE is "(to be assigned)", and "For clients
# which do not support RPC versions which can return the new RESOURCE_IDENTIFIER_TOO_LARGE error
# code, the error code will be INVALID_REQUEST": no version returns it yet, so every client is one
# of those, and the answer is INVALID_REQUEST (42).
INVALID_TOPIC_EXCEPTION = 17  # "Topic name ... INVALID_TOPIC_EXCEPTION (17) - no change"
INVALID_REQUEST = 42
OFFSET_METADATA_TOO_LARGE = 12  # "Offset commit metadata ... OFFSET_METADATA_TOO_LARGE (12) - no change"

TOPIC_NAME = Expected("topic name", 249, INVALID_TOPIC_EXCEPTION)
GROUP_ID = Expected("group id", 249, INVALID_REQUEST)
# "Group member ID ... 36 characters ... INVALID_REQUEST (42) ... In KIPs 848, 932 and 1071, the
# client library is intended to generate a UUID to be used as the member ID. As a result, the
# maximum should be the length of a serialized UUID": 36 for the member ids of those protocols
# (consumer, share and streams groups), which the client generates.
MEMBER_ID = Expected("member id", 36, INVALID_REQUEST)
# Decided: the classic protocol's member ids (JoinGroup and the APIs of its members) are not a
# client's UUID but the broker's own "<client.id or group.instance.id>-<java.util.UUID>"
# (ClassicGroup.generateMemberId), up to 249 + 1 + 36 = 286 characters; 36 would refuse every
# classic consumer with a client id. The KIP's reason for 36 ("the length of a serialized UUID")
# gives 286 for them. The offset APIs carry either kind, so they take the looser limit.
CLASSIC_MEMBER_ID = Expected("classic member id", 249 + 1 + 36, INVALID_REQUEST)
GROUP_INSTANCE_ID = Expected("group instance id", 249, INVALID_REQUEST)
CLIENT_ID = Expected("client id", 249, INVALID_REQUEST)  # the request header's, on every API
TRANSACTIONAL_ID = Expected("transactional id", 249, INVALID_REQUEST)
RACK_ID = Expected("rack id", 249, INVALID_REQUEST)
RESOURCE_NAME = Expected("resource name", 249, INVALID_REQUEST)  # "Resource name for configs and ACLs"
PRINCIPAL = Expected("ACL principal", 249, INVALID_REQUEST)
HOST = Expected("ACL host", 249, INVALID_REQUEST)
# "4096 bytes - no change ... Controlled by the offset.metadata.max.bytes configuration property"
# (Kafka compares metadata.length(), so characters).
OFFSET_METADATA = Expected("offset commit metadata", 4096, OFFSET_METADATA_TOO_LARGE)

# FindCoordinator's key is a group id or a transactional id by key_type (0 group, 1 transaction).
# Decided: key_type 2 (share, "groupId:topicId:partition", KIP-932) is a coordinator key, not an
# identifier of the table; its group id part is limited where the share group is used.
COORDINATOR_KEY = {0: GROUP_ID, 1: TRANSACTIONAL_ID, 2: None}

# api name (kio's) -> field path -> expected. "The RPCs affected will be any whose request schema
# includes a string-based identifier from the table above."
KIP_1233_FIELDS: dict[str, dict[str, Expected | dict[int, Expected | None]]] = {
    "produce": {"transactional_id": TRANSACTIONAL_ID},
    "offset_commit": {
        "group_id": GROUP_ID,
        "member_id": CLASSIC_MEMBER_ID,
        "group_instance_id": GROUP_INSTANCE_ID,
        "topics[].partitions[].committed_metadata": OFFSET_METADATA,
    },
    "offset_fetch": {
        "group_id": GROUP_ID,
        "groups[].group_id": GROUP_ID,
        "groups[].member_id": CLASSIC_MEMBER_ID,
    },
    "find_coordinator": {"key": COORDINATOR_KEY, "coordinator_keys[]": COORDINATOR_KEY},
    "join_group": {"group_id": GROUP_ID, "member_id": CLASSIC_MEMBER_ID, "group_instance_id": GROUP_INSTANCE_ID},
    "heartbeat": {"group_id": GROUP_ID, "member_id": CLASSIC_MEMBER_ID, "group_instance_id": GROUP_INSTANCE_ID},
    "leave_group": {
        "group_id": GROUP_ID,
        "member_id": CLASSIC_MEMBER_ID,
        "members[].member_id": CLASSIC_MEMBER_ID,
        "members[].group_instance_id": GROUP_INSTANCE_ID,
    },
    "sync_group": {
        "group_id": GROUP_ID,
        "member_id": CLASSIC_MEMBER_ID,
        "group_instance_id": GROUP_INSTANCE_ID,
        "assignments[].member_id": CLASSIC_MEMBER_ID,
    },
    "describe_groups": {"groups[]": GROUP_ID},
    # Decided: "Topic name: 249 characters - no change", so where Kafka checks it today: where a
    # topic is created by name (Topic.validate in CreateTopics). Everywhere else a topic name names
    # an existing topic, which cannot be longer, and Kafka answers UNKNOWN_TOPIC_OR_PARTITION.
    "create_topics": {"topics[].name": TOPIC_NAME},
    "init_producer_id": {"transactional_id": TRANSACTIONAL_ID},
    "add_partitions_to_txn": {
        "v3_and_below_transactional_id": TRANSACTIONAL_ID,
        "transactions[].transactional_id": TRANSACTIONAL_ID,
    },
    "add_offsets_to_txn": {"transactional_id": TRANSACTIONAL_ID, "group_id": GROUP_ID},
    "end_txn": {"transactional_id": TRANSACTIONAL_ID},
    "txn_offset_commit": {
        "transactional_id": TRANSACTIONAL_ID,
        "group_id": GROUP_ID,
        "member_id": CLASSIC_MEMBER_ID,
        "group_instance_id": GROUP_INSTANCE_ID,
        "topics[].partitions[].committed_metadata": OFFSET_METADATA,
    },
    # A filter's resource name, principal and host are the same identifiers (they match them
    # literally, or by prefix).
    "describe_acls": {"resource_name_filter": RESOURCE_NAME, "principal_filter": PRINCIPAL, "host_filter": HOST},
    "create_acls": {
        "creations[].resource_name": RESOURCE_NAME,
        "creations[].principal": PRINCIPAL,
        "creations[].host": HOST,
    },
    "delete_acls": {
        "filters[].resource_name_filter": RESOURCE_NAME,
        "filters[].principal_filter": PRINCIPAL,
        "filters[].host_filter": HOST,
    },
    "describe_configs": {"resources[].resource_name": RESOURCE_NAME},
    "alter_configs": {"resources[].resource_name": RESOURCE_NAME},
    "delete_groups": {"groups_names[]": GROUP_ID},
    "incremental_alter_configs": {"resources[].resource_name": RESOURCE_NAME},
    "offset_delete": {"group_id": GROUP_ID},
    "describe_transactions": {"transactional_ids[]": TRANSACTIONAL_ID},
    "consumer_group_heartbeat": {  # KIP-848
        "group_id": GROUP_ID,
        "member_id": MEMBER_ID,
        "instance_id": GROUP_INSTANCE_ID,
        "rack_id": RACK_ID,
    },
    "consumer_group_describe": {"group_ids[]": GROUP_ID},
    "share_group_heartbeat": {"group_id": GROUP_ID, "member_id": MEMBER_ID, "rack_id": RACK_ID},  # KIP-932
    "share_group_describe": {"group_ids[]": GROUP_ID},
    "share_fetch": {"group_id": GROUP_ID, "member_id": MEMBER_ID},  # KIP-932's member id
    "share_acknowledge": {"group_id": GROUP_ID, "member_id": MEMBER_ID},
    # The share group state APIs are served on broker listeners (KIP-932's share coordinator), so a
    # client can send them too: their group id is a group id.
    "initialize_share_group_state": {"group_id": GROUP_ID},
    "read_share_group_state": {"group_id": GROUP_ID},
    "write_share_group_state": {"group_id": GROUP_ID},
    "delete_share_group_state": {"group_id": GROUP_ID},
    "read_share_group_state_summary": {"group_id": GROUP_ID},
    "streams_group_heartbeat": {  # KIP-1071
        "group_id": GROUP_ID,
        "member_id": MEMBER_ID,
        "instance_id": GROUP_INSTANCE_ID,
        "rack_id": RACK_ID,
    },
    "streams_group_describe": {"group_ids[]": GROUP_ID},
    "describe_share_group_offsets": {"groups[].group_id": GROUP_ID},
    "alter_share_group_offsets": {"group_id": GROUP_ID},
    "delete_share_group_offsets": {"group_id": GROUP_ID},
}

# Fields the KIP names that the proxy does not check, and why. The broker (Kafka 5.0, or 4.x with
# resource.identifier.limit.enable) still refuses them itself.
KIP_1233_NOT_CHECKED: dict[str, dict[str, tuple[Expected, str]]] = {
    "fetch": {
        "rack_id": (
            RACK_ID,
            "Fetch travels as raw bytes (only hooks that need it decode it), and its rack id comes "
            "after every topic and partition, so reading it means decoding every Fetch. The broker "
            "keeps it only while it picks a replica for that request (KIP-392), so it cannot grow the "
            "coordinator's state, which is the KIP's motive.",
        )
    },
}

_TOPIC_REFERENCE = "names an existing topic (see create_topics: topic names are checked where created)"
_CONFIG_ENTRY = "a config's key or value, not the name of the resource it is set on"
_PIPELINE = "sent between brokers and controllers (controller or inter-broker only), never by a client"
_NOT_IN_TABLE = "not in the KIP's table"

# Every other string field of a request kio knows: api -> path -> why it is not a KIP-1233 identifier.
NOT_IDENTIFIERS: dict[str, dict[str, str]] = {
    "produce": {"topic_data[].name": _TOPIC_REFERENCE},
    "fetch": {
        "topics[].topic": _TOPIC_REFERENCE,
        "forgotten_topics_data[].topic": _TOPIC_REFERENCE,
        "cluster_id": "a follower's cluster id (KIP-595); " + _NOT_IN_TABLE,
    },
    "list_offsets": {"topics[].name": _TOPIC_REFERENCE},
    # Metadata may create a topic (allow_auto_topic_creation); the broker validates that name itself
    # with INVALID_TOPIC_EXCEPTION, as it always has ("no change").
    "metadata": {"topics[].name": _TOPIC_REFERENCE + "; auto-creation is the broker's own"},
    "offset_commit": {"topics[].name": _TOPIC_REFERENCE},
    "offset_fetch": {"topics[].name": _TOPIC_REFERENCE, "groups[].topics[].name": _TOPIC_REFERENCE},
    "join_group": {
        "protocol_type": 'the group\'s protocol type ("consumer"); ' + _NOT_IN_TABLE,
        "protocols[].name": "an assignor's name; " + _NOT_IN_TABLE,
        "reason": "free text for the broker's log (KIP-800); " + _NOT_IN_TABLE,
    },
    "leave_group": {"members[].reason": "free text for the broker's log (KIP-800); " + _NOT_IN_TABLE},
    "sync_group": {
        "protocol_type": "the group's protocol type; " + _NOT_IN_TABLE,
        "protocol_name": "an assignor's name; " + _NOT_IN_TABLE,
    },
    "list_groups": {"states_filter[]": "a group state name", "types_filter[]": "a group type name"},
    "sasl_handshake": {"mechanism": "a SASL mechanism name"},
    "api_versions": {
        "client_software_name": "the client library's name (KIP-511); " + _NOT_IN_TABLE,
        "client_software_version": "the client library's version (KIP-511); " + _NOT_IN_TABLE,
    },
    "create_topics": {"topics[].configs[].name": _CONFIG_ENTRY, "topics[].configs[].value": _CONFIG_ENTRY},
    "delete_topics": {"topic_names[]": _TOPIC_REFERENCE, "topics[].name": _TOPIC_REFERENCE},
    "delete_records": {"topics[].name": _TOPIC_REFERENCE},
    "offset_for_leader_epoch": {"topics[].topic": _TOPIC_REFERENCE},
    "add_partitions_to_txn": {
        "v3_and_below_topics[].name": _TOPIC_REFERENCE,
        "transactions[].topics[].name": _TOPIC_REFERENCE,
    },
    "write_txn_markers": {"markers[].topics[].name": _TOPIC_REFERENCE},
    "txn_offset_commit": {"topics[].name": _TOPIC_REFERENCE},
    "describe_configs": {"resources[].configuration_keys[]": _CONFIG_ENTRY},
    "alter_configs": {"resources[].configs[].name": _CONFIG_ENTRY, "resources[].configs[].value": _CONFIG_ENTRY},
    "alter_replica_log_dirs": {"dirs[].path": "a broker's log directory", "dirs[].topics[].name": _TOPIC_REFERENCE},
    "describe_log_dirs": {"topics[].topic": _TOPIC_REFERENCE},
    "create_partitions": {"topics[].name": _TOPIC_REFERENCE},
    # Decided: "ACL principal" is the principal of an ACL; a delegation token's owner and renewers
    # are principals of tokens, which the table does not name.
    "create_delegation_token": {
        "renewers[].principal_type": 'a principal type ("User"); ' + _NOT_IN_TABLE,
        "renewers[].principal_name": "a delegation token's renewer, not an ACL's principal",
        "owner_principal_type": "a principal type; " + _NOT_IN_TABLE,
        "owner_principal_name": "a delegation token's owner, not an ACL's principal",
    },
    "describe_delegation_token": {
        "owners[].principal_type": "a principal type; " + _NOT_IN_TABLE,
        "owners[].principal_name": "a delegation token's owner, not an ACL's principal",
    },
    "elect_leaders": {"topic_partitions[].topic": _TOPIC_REFERENCE},
    "incremental_alter_configs": {
        "resources[].configs[].name": _CONFIG_ENTRY,
        "resources[].configs[].value": _CONFIG_ENTRY,
    },
    "alter_partition_reassignments": {"topics[].name": _TOPIC_REFERENCE},
    "list_partition_reassignments": {"topics[].name": _TOPIC_REFERENCE},
    "offset_delete": {"topics[].name": _TOPIC_REFERENCE},
    # Decided: "Resource name for configs and ACLs" is a ConfigResource's or an ACL resource
    # pattern's name; client quotas (KIP-546) address entities (user, client-id, ip) of their own.
    "describe_client_quotas": {
        "components[].entity_type": "a quota entity type",
        "components[].match": "a quota entity filter, not a config or ACL resource name",
    },
    "alter_client_quotas": {
        "entries[].entity[].entity_type": "a quota entity type",
        "entries[].entity[].entity_name": "a quota entity, not a config or ACL resource name",
        "entries[].ops[].key": "a quota's key",
    },
    "describe_user_scram_credentials": {"users[].name": "a SCRAM user; " + _NOT_IN_TABLE},
    "alter_user_scram_credentials": {
        "deletions[].name": "a SCRAM user; " + _NOT_IN_TABLE,
        "upsertions[].name": "a SCRAM user; " + _NOT_IN_TABLE,
    },
    "vote": {"cluster_id": _PIPELINE, "topics[].topic_name": _PIPELINE},
    "begin_quorum_epoch": {
        "cluster_id": _PIPELINE,
        "topics[].topic_name": _PIPELINE,
        "leader_endpoints[].name": _PIPELINE,
        "leader_endpoints[].host": _PIPELINE,
    },
    "end_quorum_epoch": {
        "cluster_id": _PIPELINE,
        "topics[].topic_name": _PIPELINE,
        "leader_endpoints[].name": _PIPELINE,
        "leader_endpoints[].host": _PIPELINE,
    },
    "describe_quorum": {"topics[].topic_name": _TOPIC_REFERENCE},
    "update_features": {"feature_updates[].feature": "a feature name; " + _NOT_IN_TABLE},
    "fetch_snapshot": {"cluster_id": _PIPELINE, "topics[].name": _PIPELINE},
    "describe_producers": {"topics[].name": _TOPIC_REFERENCE},
    # A broker's own rack, sent only to the controller: the KIP's "Rack ID" is a client's.
    "broker_registration": {
        "cluster_id": _PIPELINE,
        "listeners[].name": _PIPELINE,
        "listeners[].host": _PIPELINE,
        "features[].name": _PIPELINE,
        "rack": _PIPELINE,
    },
    "list_transactions": {
        "state_filters[]": "a transaction state name",
        # Decided: a regular expression (KIP-1152) that matches transactional ids is not one.
        "transactional_id_pattern": "a regular expression over transactional ids, not one",
    },
    "consumer_group_heartbeat": {
        "subscribed_topic_names[]": _TOPIC_REFERENCE,
        "server_assignor": "an assignor's name; " + _NOT_IN_TABLE,
        "subscribed_topic_regex": "a regular expression over topic names, not one",
    },
    "controller_registration": {
        "listeners[].name": _PIPELINE,
        "listeners[].host": _PIPELINE,
        "features[].name": _PIPELINE,
    },
    "describe_topic_partitions": {"topics[].name": _TOPIC_REFERENCE, "cursor.topic_name": _TOPIC_REFERENCE},
    "share_group_heartbeat": {"subscribed_topic_names[]": _TOPIC_REFERENCE},
    "add_raft_voter": {"cluster_id": _PIPELINE, "listeners[].name": _PIPELINE, "listeners[].host": _PIPELINE},
    "remove_raft_voter": {"cluster_id": _PIPELINE},
    "update_raft_voter": {"cluster_id": _PIPELINE, "listeners[].name": _PIPELINE, "listeners[].host": _PIPELINE},
    "streams_group_heartbeat": {
        "topology.subtopologies[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
        "topology.subtopologies[].source_topics[]": _TOPIC_REFERENCE,
        "topology.subtopologies[].source_topic_regex[]": "a regular expression over topic names, not one",
        # Decided: Streams creates its internal topics through CreateTopics, where they are checked.
        "topology.subtopologies[].state_changelog_topics[].name": _TOPIC_REFERENCE,
        "topology.subtopologies[].state_changelog_topics[].topic_configs[].key": _CONFIG_ENTRY,
        "topology.subtopologies[].state_changelog_topics[].topic_configs[].value": _CONFIG_ENTRY,
        "topology.subtopologies[].repartition_sink_topics[]": _TOPIC_REFERENCE,
        "topology.subtopologies[].repartition_source_topics[].name": _TOPIC_REFERENCE,
        "topology.subtopologies[].repartition_source_topics[].topic_configs[].key": _CONFIG_ENTRY,
        "topology.subtopologies[].repartition_source_topics[].topic_configs[].value": _CONFIG_ENTRY,
        "active_tasks[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
        "standby_tasks[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
        "warmup_tasks[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
        "process_id": "a Streams process (a UUID); " + _NOT_IN_TABLE,
        "user_endpoint.host": "a Streams application's endpoint, not an ACL's host",
        "client_tags[].key": "a Streams client tag; " + _NOT_IN_TABLE,
        "client_tags[].value": "a Streams client tag; " + _NOT_IN_TABLE,
        "task_offsets[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
        "task_end_offsets[].subtopology_id": "a Streams subtopology; " + _NOT_IN_TABLE,
    },
    "describe_share_group_offsets": {"groups[].topics[].topic_name": _TOPIC_REFERENCE},
    "alter_share_group_offsets": {"topics[].topic_name": _TOPIC_REFERENCE},
    "delete_share_group_offsets": {"topics[].topic_name": _TOPIC_REFERENCE},
}
