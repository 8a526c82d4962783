"""A raw Kafka connection for tests that need exact bytes on the wire (kio encodes)."""

from __future__ import annotations

import datetime
import socket
import ssl
from typing import Any

from kio.index import load_request_schema

from policies.api_keys import API_VERSIONS, FETCH, JOIN_GROUP, METADATA
from proxy.protocol import wire


def frame(api_key: int, version: int, correlation_id: int, body: Any, client_id: str = "raw-test") -> bytes:
    return wire.encode_frame(wire.request_header_for(api_key, version, correlation_id, client_id), body)


def api_versions_frame(correlation_id: int, version: int = 3, client_id: str = "raw-test") -> bytes:
    schema = load_request_schema(API_VERSIONS, version)
    return frame(
        API_VERSIONS,
        version,
        correlation_id,
        schema(client_software_name="raw", client_software_version="1"),
        client_id,
    )


def api_versions_over_tls(
    address: str, ctx: ssl.SSLContext, correlation_id: int = 11, session: ssl.SSLSession | None = None
) -> tuple[int, ssl.SSLSession | None, bool]:
    """One ApiVersions round trip over TLS: (the answer's correlation id, the TLS session, whether
    it was resumed). Raises ConnectionError when the other side closes before answering."""
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost", session=session) as sock,
    ):
        sock.sendall(api_versions_frame(correlation_id))
        data = b""
        while len(data) < 8:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed by the proxy")
            data += chunk
        return int.from_bytes(data[4:8], "big"), sock.session, sock.session_reused


def metadata_frame(correlation_id: int, version: int = 12) -> bytes:
    schema = load_request_schema(METADATA, version)
    return frame(
        METADATA,
        version,
        correlation_id,
        schema(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False),
    )


def join_group_frame(
    correlation_id: int,
    group: str,
    version: int,
    member_id: str,
    instance_id: str | None,
    session_ms: int,
    rebalance_ms: int,
) -> bytes:
    """A consumer JoinGroup (one "range" protocol, empty metadata) with these ids and timeouts."""
    schema = load_request_schema(JOIN_GROUP, version)
    protocol = schema.__dataclass_fields__["protocols"].type.__args__[0]
    fields: dict[str, Any] = {
        "group_id": group,
        "session_timeout": datetime.timedelta(milliseconds=session_ms),
        "rebalance_timeout": datetime.timedelta(milliseconds=rebalance_ms),
        "member_id": member_id,
        "protocol_type": "consumer",
        "protocols": (protocol(name="range", metadata=b""),),
    }
    if version >= 5:
        fields["group_instance_id"] = instance_id
    if version >= 8:
        fields["reason"] = None
    return frame(JOIN_GROUP, version, correlation_id, schema(**fields))


def fetch_frame(
    correlation_id: int, topic_id: Any, max_wait_ms: int, version: int = 13, max_bytes: int = 1048576
) -> bytes:
    m = __import__(f"kio.schema.fetch.v{version}.request", fromlist=["x"])
    partition = m.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=max_bytes,
    )
    body = m.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(m.FetchTopic(topic_id=topic_id, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return frame(FETCH, version, correlation_id, body)


class RawConnection:
    """One Kafka connection with exact bytes on the wire; ``ca_file`` makes it TLS (``cert``:
    a client certificate and key for mTLS), ``source`` picks the client address (e.g.
    127.0.0.2 for per-IP limits)."""

    def __init__(
        self,
        address: str,
        timeout: float = 10.0,
        *,
        ca_file: str | None = None,
        cert: tuple[str, str] | None = None,
        source: str | None = None,
    ) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection(
            (host, int(port)), timeout=timeout, source_address=(source, 0) if source else None
        )
        if ca_file is not None:
            context = ssl.create_default_context(cafile=ca_file)
            if cert is not None:
                context.load_cert_chain(*cert)
            sock = context.wrap_socket(sock, server_hostname=host)
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"closed after {len(data)} of {n} bytes")
            data += chunk
        return data

    def read_frame(self) -> bytes:
        size = int.from_bytes(self._exactly(4), "big")
        return size.to_bytes(4, "big") + self._exactly(size)

    def read_response(self, api_key: int, version: int) -> Any:
        return wire.decode_response(self.read_frame(), api_key, version)

    def closed_by_peer(self) -> bool:
        """True when the other side closed (EOF or reset) within the socket timeout."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def bytes_until_closed(self) -> bytes:
        """Everything the peer writes until it closes (EOF or reset)."""
        data = b""
        try:
            while chunk := self.sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
