"""The proxy's one YAML config file, parsed once into frozen, typed objects.

Shape: ``mode``, ``workers``, ``upstream``, ``listeners``, ``admin``, ``policies``, ``audit``.
Policy keys are Kafka's own property names (``socket.request.max.bytes``, ...)
with Kafka's defaults and validation rules. Errors name the key and the rule.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from policies.api_keys import INT_MAX
from policies.connections import ConnectionLimits
from policies.group_size import GroupSizeConfig
from policies.identifier_limits import IdentifierLimits
from policies.memory_pool import validate_settings as validate_pool_settings
from policies.properties import (
    CLASSIC_MEMBER_ID_MAX_LENGTH,
    CONNECTIONS_MAX_IDLE_MS,
    GROUP_CONSUMER_MAX_SIZE,
    GROUP_JOIN_RATE_PER_MINUTE,
    GROUP_MAX_SESSION_TIMEOUT_MS,
    GROUP_MAX_SIZE,
    GROUP_MIN_SESSION_TIMEOUT_MS,
    GROUP_RECONCILE_INTERVAL_MS,
    LISTENER_PREFIX,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_CONNECTIONS_PER_IP_OVERRIDES,
    MAX_CONNECTIONS_WAIT_MS,
    MAX_RESPONSE_SIZE,
    MAX_SSL_CONNECTIONS,
    MAX_SSL_HANDSHAKES_PER_TURN,
    MEMBER_ID_MAX_LENGTH,
    OFFSET_METADATA_MAX_BYTES,
    PROPERTIES,
    QUEUED_MAX_REQUEST_BYTES,
    QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION,
    REQUEST_BODY_TIMEOUT_MS,
    RESOURCE_IDENTIFIER_LIMIT_ENABLE,
    RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE,
    RESOURCE_IDENTIFIER_MAX_LENGTH,
    SASL_SERVER_MAX_RECEIVE_SIZE,
    SOCKET_REQUEST_MAX_BYTES,
    TOPIC_NAME_MAX_LENGTH,
)
from proxy.config.certificates import IDENTITY_CA_CERTIFICATE, UPSTREAM_CERTIFICATE, TlsFiles, certificate_problems
from proxy.config.key_password import read_key_password
from proxy.config.strict_yaml import StrictYamlError, read_yaml

__all__ = ["Config", "ConfigError", "expand_environment", "load_config", "parse_config", "parse_config_text"]


class ConfigError(Exception):
    """A config that cannot be used; the message names the key and the rule."""


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several keys of one section, raising ``ValueError`` naming them.

    It reads the section as written, defaults filled in (strict types make a valid
    value as written the value parsed), and runs whenever none of ``keys`` has an
    error of its own, whatever else is wrong: one pass reports every problem.
    A rule that reads other parts tolerantly (as raw YAML) lists no keys."""

    keys: tuple[str, ...]
    check: Callable[[Mapping[str, Any]], object]


def _cross_field_error(message: str) -> PydanticCustomError:
    return PydanticCustomError("cross_field", "{rule}", {"rule": message})


class _Frozen(BaseModel):
    # strict: "100" is not an int and 1 is not a bool, as in Kafka's ConfigDef. Keys are
    # the file's names only (Kafka's property names), never the Python field names.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    cross_field_rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _every_error_in_one_pass(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        errors: list[Any] = []
        model = None
        try:
            model = handler(data)
        except ValidationError as exc:
            errors = [
                {"type": _cross_field_error(e["msg"]) if e["type"] == "cross_field" else e["type"]}
                | {k: e[k] for k in ("loc", "input", "ctx") if k in e}
                for e in exc.errors()
            ]
        if isinstance(data, Mapping) and cls.cross_field_rules:
            invalid = {e["loc"][0] for e in errors if e["loc"]}
            values = {**cls._defaults(), **data}
            for rule in cls.cross_field_rules:
                if invalid.isdisjoint(rule.keys):
                    try:
                        rule.check(values)
                    except ValueError as exc:
                        errors.append({"type": _cross_field_error(str(exc)), "loc": (), "input": data})
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return model

    @classmethod
    def _defaults(cls) -> dict[str, Any]:
        return {
            f.alias or name: f.get_default(call_default_factory=True)
            for name, f in cls.model_fields.items()
            if not f.is_required()
        }


def _kafka_bool(value: Any) -> Any:
    """Kafka's ConfigDef BOOLEAN: true or false, also as a string in any case (as a
    value copied from server.properties or quoted by a template is); never yes/on/1."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_shown(value)}")
    return value


KafkaBool = Annotated[bool, BeforeValidator(_kafka_bool)]


def _host_port(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{key} must be 'host:port' with a port 0-65535, got {value!r}")
    return host.strip("[]"), int(port)


def _existing_file(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        found = Path(value).is_file()
    except OSError as exc:  # a folder on the way this user cannot enter (e.g. a key kept root's)
        raise ValueError(f"cannot read {value!r}: {exc.strerror}") from None
    if not found:
        raise ValueError(f"file not found: {value!r}")
    return value


def _set_env_var(value: str | None) -> str | None:
    if value is not None and value not in os.environ:
        raise ValueError(f"environment variable {value!r} is not set")
    return value


def _one_password_source(v: Mapping[str, Any]) -> None:
    # Key passwords come from a file or the environment, never from this YAML file.
    if v["key_password_file"] is not None and v["key_password_env"] is not None:
        raise ValueError("set key_password_file or key_password_env, not both")
    if (v["key_password_file"] is not None or v["key_password_env"] is not None) and v["key_file"] is None:
        raise ValueError("a key password needs key_file")


_PASSWORD_RULE = CrossFieldRule(("key_password_file", "key_password_env", "key_file"), _one_password_source)


def _cert_and_key_together(v: Mapping[str, Any]) -> None:
    if (v["cert_file"] is None) != (v["key_file"] is None):
        raise ValueError("cert_file and key_file must be set together (client certificate)")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_IDENTITY_VALIDITY_S = 30 * 86400


def _seconds(value: Any) -> Any:
    """Seconds as an integer (``3600``) or a duration (``90s``, ``15m``, ``1h``, ``1d``)."""
    if isinstance(value, str):
        text = value.strip()
        number, unit = text[:-1], text[-1:]
        if unit not in _DURATION_UNITS or not number.isdigit():
            raise ValueError(f"must be seconds (3600) or a duration such as 90s, 15m, 1h, 1d; got {_shown(value)}")
        return int(number) * _DURATION_UNITS[unit]
    return value


class ClientIdentity(_Frozen):
    """The identity CA: the proxy connects to brokers with a certificate it issues for each
    client that presented a verified certificate, carrying that client's subject and SANs."""

    ca_cert_file: str = Field(description="The identity CA's certificate (PEM), which signs each client's certificate.")
    ca_key_file: str = Field(description="The identity CA's private key (PEM), readable by the proxy's user only.")
    validity: Annotated[int, BeforeValidator(_seconds)] = Field(
        default=3600,
        ge=60,
        le=MAX_IDENTITY_VALIDITY_S,
        description="Lifetime of an issued certificate: seconds (3600) or a duration (90s, 15m, 1h, 1d).",
    )
    without_certificate: Literal["refuse", "proxy"] = Field(
        default="refuse",
        description="A client without a verified certificate: refused, or connected with the proxy's own cert_file.",
    )
    cache_size: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Subjects whose certificate and TLS context are kept (~27 KB each), least recently used out.",
    )

    _files = field_validator("ca_cert_file", "ca_key_file")(_existing_file)


def _identity_needs_tls(v: Mapping[str, Any]) -> None:
    if v["client_identity"] is None:
        return
    if v["enabled"] is not True:
        raise ValueError("client_identity needs enabled: true (identities are TLS client certificates)")
    if v["ca_file"] is None:
        # Each identity has its own TLS context: one holding the system's CAs costs ~0.8 MB and ~20 ms.
        raise ValueError("client_identity needs ca_file (the CA that verifies the brokers), not the system's CAs")


class UpstreamTls(_Frozen):
    enabled: KafkaBool = Field(default=False, description="TLS toward the brokers.")
    ca_file: str | None = Field(
        default=None, description="PEM bundle that verifies the brokers; null: the system's CAs."
    )
    cert_file: str | None = Field(
        default=None, description="Client certificate toward the brokers (mTLS), set together with key_file."
    )
    key_file: str | None = Field(default=None, description="The client certificate's private key (PEM).")
    key_password_file: str | None = Field(
        default=None, description="A file holding the key's password (a trailing newline dropped)."
    )
    key_password_env: str | None = Field(
        default=None, description="Or an environment variable holding the key's password."
    )
    server_hostname: str | None = Field(
        default=None, description="Name to verify in the broker's certificate; null: the host dialled."
    )
    client_identity: ClientIdentity | None = Field(
        default=None,
        description="The identity CA: each mTLS client reaches the brokers as itself (docs/identity.md).",
    )

    _files = field_validator("ca_file", "cert_file", "key_file", "key_password_file")(_existing_file)
    _env = field_validator("key_password_env")(_set_env_var)
    cross_field_rules = (
        CrossFieldRule(("cert_file", "key_file"), _cert_and_key_together),
        _PASSWORD_RULE,
        CrossFieldRule(("client_identity", "enabled", "ca_file"), _identity_needs_tls),
    )


def _bootstrap_addresses(value: tuple[str, ...]) -> tuple[str, ...]:
    for item in value:
        _host_port(item, "each bootstrap server")
    return value


class Upstream(_Frozen):
    bootstrap_servers: tuple[str, ...] = Field(
        min_length=1, strict=False, description="host:port of the brokers to bootstrap from."
    )  # a YAML list
    tls: UpstreamTls = Field(default=UpstreamTls(), description="TLS toward the brokers.")

    _addresses = field_validator("bootstrap_servers")(_bootstrap_addresses)

    def addresses(self) -> list[tuple[str, int]]:
        return [_host_port(s, "bootstrap_servers") for s in self.bootstrap_servers]


def _ca_for_client_auth(v: Mapping[str, Any]) -> None:
    if v["client_auth"] != "none" and v["ca_file"] is None:
        raise ValueError(f"client_auth: {v['client_auth']} needs ca_file to verify clients")


class ListenerTls(_Frozen):
    cert_file: str = Field(description="The listener's certificate chain (PEM): leaf first, then intermediates.")
    key_file: str = Field(description="Its private key (PEM).")
    key_password_file: str | None = Field(
        default=None, description="A file holding the key's password (a trailing newline dropped)."
    )
    key_password_env: str | None = Field(
        default=None, description="Or an environment variable holding the key's password."
    )
    ca_file: str | None = Field(default=None, description="PEM bundle that verifies client certificates.")
    client_auth: Literal["none", "optional", "required"] = Field(
        default="none", description="Client certificates: none, optional or required (mTLS)."
    )

    _files = field_validator("cert_file", "key_file", "ca_file", "key_password_file")(_existing_file)
    _env = field_validator("key_password_env")(_set_env_var)
    cross_field_rules = (CrossFieldRule(("client_auth", "ca_file"), _ca_for_client_auth), _PASSWORD_RULE)


def parse_ip_overrides(value: str) -> dict[str, int]:
    """Kafka's ``max.connections.per.ip.overrides``: ``"host:100,127.0.0.2:200"``;
    hostnames are resolved now, at load, to every address they have."""
    overrides: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, sep, limit = item.rpartition(":")
        if not sep or not host or not limit.isdigit():
            raise ValueError(f"{item!r} is not host:limit")
        try:
            infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
        except socket.gaierror as exc:
            raise ValueError(f"cannot resolve {host!r}: {exc.strerror}") from None
        for info in infos:
            overrides[str(info[4][0])] = int(limit)
    return overrides


def _check_bind(value: str) -> str:
    _host_port(value, "bind")
    return value


PASSTHROUGH = "passthrough"
# The tags of a listener's ``tls`` union: left out of the key an error names.
_TERMINATION_TAG, _PASSTHROUGH_TAG = "tls-termination", "tls-passthrough"


def _tls_kind(value: Any) -> str:
    return _TERMINATION_TAG if isinstance(value, ListenerTls | Mapping) else _PASSTHROUGH_TAG


# A listener's ``tls``: a mapping (this proxy terminates TLS) or ``passthrough``.
ListenerTlsSetting = Annotated[
    Annotated[ListenerTls, Tag(_TERMINATION_TAG)] | Annotated[Literal["passthrough"], Tag(_PASSTHROUGH_TAG)],
    Discriminator(_tls_kind),
]


def _passthrough_brokers_with_passthrough(v: Mapping[str, Any]) -> None:
    if v["tls"] == PASSTHROUGH and not v["passthrough_brokers"]:
        raise ValueError("tls: passthrough needs passthrough_brokers (node id: host:port of a broker's TLS listener)")
    if v["tls"] != PASSTHROUGH and v["passthrough_brokers"]:
        raise ValueError("passthrough_brokers is only for a listener with tls: passthrough")


def _no_sasl_flag_on_passthrough(v: Mapping[str, Any]) -> None:
    # sasl bounds frames before authentication (sasl.server.max.receive.size): none is read here.
    if v["tls"] == PASSTHROUGH and v["sasl"] is True:
        raise ValueError("sasl: true cannot apply to tls: passthrough (its frames are encrypted end to end)")


class Listener(_Frozen):
    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$", description="Names the listener in metrics, logs and listener.name.<name>.* keys."
    )
    bind: str = Field(description="host:port clients connect to: this listener's bootstrap address.")
    advertised_host: str = Field(default="127.0.0.1", description="The host written into rewritten responses.")
    node_port_base: int = Field(
        default=29100, ge=1, le=65535, description="Cluster mode: broker node N is served on node_port_base + N."
    )
    # proxy/serve/passthrough.py relays a passthrough listener's bytes.
    tls: ListenerTlsSetting | None = Field(
        default=None,
        description="null: plaintext; a mapping: this proxy terminates TLS; passthrough: the client's TLS bytes "
        "are relayed, undecrypted, to one broker, and only the connection-level policies apply.",
    )
    passthrough_brokers: dict[Annotated[int, Strict(False)], str] = Field(
        default_factory=dict,
        description="tls: passthrough only: node id to host:port of that broker's TLS listener for clients. The "
        "bootstrap port relays to the first that accepts; in cluster mode, node port node_port_base + id relays "
        "to broker id (the broker advertises that port itself).",
    )  # "0" too (JSON keys)
    sasl: KafkaBool = Field(
        default=False,
        description="Clients authenticate with SASL here (SASL_PLAINTEXT, or SASL_SSL with tls; passed through to "
        "the broker): until the broker accepts their SaslAuthenticate, frames are bounded by "
        "sasl.server.max.receive.size.",
    )
    protected: KafkaBool = Field(
        default=False, description="Exempt from the broker-wide caps max.connections and max.ssl.connections."
    )

    _bind = field_validator("bind")(_check_bind)
    cross_field_rules = (
        CrossFieldRule(("tls", "passthrough_brokers"), _passthrough_brokers_with_passthrough),
        CrossFieldRule(("tls", "sasl"), _no_sasl_flag_on_passthrough),
    )

    @field_validator("passthrough_brokers")
    @classmethod
    def _broker_addresses(cls, value: dict[int, str]) -> dict[int, str]:
        for node_id, address in value.items():
            if node_id < 0:
                raise ValueError(f"node ids must be >= 0, got {node_id}")
            _host_port(address, f"passthrough_brokers[{node_id}]")
        return value

    @property
    def bind_address(self) -> tuple[str, int]:
        return _host_port(self.bind, "bind")

    @property
    def passthrough(self) -> bool:
        return self.tls == PASSTHROUGH

    @property
    def termination(self) -> ListenerTls | None:
        """The TLS this proxy terminates on this listener (None: plaintext or passthrough)."""
        return self.tls if isinstance(self.tls, ListenerTls) else None

    def passthrough_addresses(self) -> dict[int, tuple[str, int]]:
        return {n: _host_port(a, "passthrough_brokers") for n, a in self.passthrough_brokers.items()}

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what this listener speaks (``listener.security.protocol.map``)."""
        return ("SASL_" if self.sasl else "") + ("SSL" if self.tls is not None else "PLAINTEXT")


class Admin(_Frozen):
    bind: str = Field(
        default="127.0.0.1:9464",
        description="host:port of /metrics, /healthz and /readyz; 0.0.0.0:9464 to be scraped from elsewhere.",
    )

    _bind = field_validator("bind")(_check_bind)

    @property
    def bind_address(self) -> tuple[str, int]:
        return _host_port(self.bind, "bind")


PolicyMode = Literal["enforce", "observe"]


def _property(name: str) -> Any:
    """The ``policies`` field of a Kafka property: its name as the key, its default and bounds."""
    prop = PROPERTIES[name]
    return Field(default=prop.default, ge=prop.at_least, le=prop.at_most, alias=name, description=prop.meaning)


def _listener_key(key: object) -> tuple[str, str] | None:
    """(listener, property) of a ``listener.name.<listener>.<property>`` key."""
    if not isinstance(key, str) or not key.startswith(LISTENER_PREFIX):
        return None
    listener, _, prop = key.removeprefix(LISTENER_PREFIX).partition(".")
    return (listener, prop) if listener and prop else None


def _per_listener(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``listener.name.<l>.<prop>: v`` keys -> ``{<l>: {<prop>: v}}``."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        parts = _listener_key(key)
        if parts is not None:
            overrides.setdefault(parts[0], {})[parts[1]] = value
    return overrides


def _connection_limits(flat: Mapping[str, Any]) -> ConnectionLimits:
    """Kafka's connection quota settings from the policies as written (Kafka names)."""
    return ConnectionLimits(
        max_connections=flat[MAX_CONNECTIONS],
        max_connections_per_ip=flat[MAX_CONNECTIONS_PER_IP],
        max_connections_per_ip_overrides=parse_ip_overrides(flat[MAX_CONNECTIONS_PER_IP_OVERRIDES]),
        max_ssl_connections=flat[MAX_SSL_CONNECTIONS],
        listener_max_connections={
            name: props[MAX_CONNECTIONS] for name, props in _per_listener(flat).items() if MAX_CONNECTIONS in props
        },
        connections_max_idle_ms=flat[CONNECTIONS_MAX_IDLE_MS],
    )


def _group_size_config(flat: Mapping[str, Any]) -> GroupSizeConfig:
    return GroupSizeConfig(
        group_max_size=flat[GROUP_MAX_SIZE],
        group_consumer_max_size=flat[GROUP_CONSUMER_MAX_SIZE],
        join_rate_per_minute=flat[GROUP_JOIN_RATE_PER_MINUTE],
        reconcile_interval_seconds=flat[GROUP_RECONCILE_INTERVAL_MS] / 1000,
        min_session_timeout_seconds=flat[GROUP_MIN_SESSION_TIMEOUT_MS] / 1000,
        max_session_timeout_seconds=flat[GROUP_MAX_SESSION_TIMEOUT_MS] / 1000,
    )


def _pool_fits_the_largest_request(flat: Mapping[str, Any]) -> None:
    validate_pool_settings(
        flat[QUEUED_MAX_REQUEST_BYTES],
        flat[SOCKET_REQUEST_MAX_BYTES],
        flat[QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION],
    )


class ListenerPolicies(_Frozen):
    """Per-listener overrides, written ``listener.name.<listener>.<property>`` as in Kafka."""

    max_response_size: int | None = Field(
        default=None, ge=1, le=INT_MAX, alias=MAX_RESPONSE_SIZE, description="This listener's max.response.size."
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        le=INT_MAX,
        alias=MAX_CONNECTIONS,
        description="This listener's own connection cap (protected listeners too).",
    )


class Policies(_Frozen):
    """Kafka broker properties, by their Kafka names, and each policy's mode."""

    mode: PolicyMode = Field(
        default="enforce",
        description="Every policy's mode unless its own says: enforce, or observe (decide, count and audit, "
        "but let the traffic through).",
    )
    # Each property's default, bounds and meaning: policies/properties.py.
    socket_request_max_bytes: int = _property(SOCKET_REQUEST_MAX_BYTES)
    sasl_server_max_receive_size: int = _property(SASL_SERVER_MAX_RECEIVE_SIZE)
    max_response_size: int = _property(MAX_RESPONSE_SIZE)
    response_size_mode: PolicyMode | None = Field(
        default=None, alias="response.size.mode", description="The response size guard's mode; null: policies.mode."
    )
    max_connections: int = _property(MAX_CONNECTIONS)
    max_connections_per_ip: int = _property(MAX_CONNECTIONS_PER_IP)
    max_connections_per_ip_overrides: str = _property(MAX_CONNECTIONS_PER_IP_OVERRIDES)
    max_ssl_connections: int = _property(MAX_SSL_CONNECTIONS)
    connections_max_idle_ms: int = _property(CONNECTIONS_MAX_IDLE_MS)
    max_connections_wait_ms: int = _property(MAX_CONNECTIONS_WAIT_MS)
    connections_mode: PolicyMode | None = Field(
        default=None, alias="connections.mode", description="The connection caps' mode; null: policies.mode."
    )
    # TLS handshakes are computed on the one event loop: the rest wait for the next turn.
    max_ssl_handshakes_per_turn: int = _property(MAX_SSL_HANDSHAKES_PER_TURN)
    group_max_size: int = _property(GROUP_MAX_SIZE)
    group_consumer_max_size: int = _property(GROUP_CONSUMER_MAX_SIZE)
    group_join_rate_per_minute: int = _property(GROUP_JOIN_RATE_PER_MINUTE)
    group_size_mode: PolicyMode | None = Field(
        default=None, alias="group.size.mode", description="The group size policy's mode; null: policies.mode."
    )
    # Kafka's bounds on a classic member's session timeout: how long a join's slot can live.
    group_min_session_timeout_ms: int = _property(GROUP_MIN_SESSION_TIMEOUT_MS)
    group_max_session_timeout_ms: int = _property(GROUP_MAX_SESSION_TIMEOUT_MS)
    group_reconcile_interval_ms: int = _property(GROUP_RECONCILE_INTERVAL_MS)
    queued_max_request_bytes: int = _property(QUEUED_MAX_REQUEST_BYTES)
    queued_max_request_bytes_per_connection: int = _property(QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION)
    request_body_timeout_ms: int = _property(REQUEST_BODY_TIMEOUT_MS)
    memory_pool_mode: PolicyMode | None = Field(
        default=None, alias="memory.pool.mode", description="The memory pool's mode; null: policies.mode."
    )
    # KIP-1233 identifier lengths (limits are UTF-16 code units, as Java counts).
    resource_identifier_limit_enable: KafkaBool = _property(RESOURCE_IDENTIFIER_LIMIT_ENABLE)
    resource_identifier_max_length: int = _property(RESOURCE_IDENTIFIER_MAX_LENGTH)
    member_id_max_length: int = _property(MEMBER_ID_MAX_LENGTH)
    classic_member_id_max_length: int = _property(CLASSIC_MEMBER_ID_MAX_LENGTH)
    topic_name_max_length: int = _property(TOPIC_NAME_MAX_LENGTH)
    offset_metadata_max_bytes: int = _property(OFFSET_METADATA_MAX_BYTES)
    resource_identifier_limit_error_code: int = _property(RESOURCE_IDENTIFIER_LIMIT_ERROR_CODE)
    resource_identifier_limit_mode: PolicyMode | None = Field(
        default=None,
        alias="resource.identifier.limit.mode",
        description="The identifier checks' mode; null: policies.mode.",
    )
    listener_overrides: dict[str, ListenerPolicies] = Field(default_factory=dict, alias="listener.name")

    # Kafka's rules over several keys (KafkaConfig, ConnectionQuotas, the memory pool's).
    cross_field_rules = (
        CrossFieldRule(
            (
                GROUP_MAX_SIZE,
                GROUP_CONSUMER_MAX_SIZE,
                GROUP_JOIN_RATE_PER_MINUTE,
                GROUP_RECONCILE_INTERVAL_MS,
                GROUP_MIN_SESSION_TIMEOUT_MS,
                GROUP_MAX_SESSION_TIMEOUT_MS,
            ),
            _group_size_config,
        ),
        CrossFieldRule(
            (
                MAX_CONNECTIONS,
                MAX_CONNECTIONS_PER_IP,
                MAX_CONNECTIONS_PER_IP_OVERRIDES,
                MAX_SSL_CONNECTIONS,
                CONNECTIONS_MAX_IDLE_MS,
                "listener.name",
            ),
            _connection_limits,
        ),
        CrossFieldRule(
            (QUEUED_MAX_REQUEST_BYTES, SOCKET_REQUEST_MAX_BYTES, QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION),
            _pool_fits_the_largest_request,
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_listener_keys(cls, raw: Any) -> Any:
        """``listener.name.<l>.<prop>: v`` -> ``listener.name: {<l>: {<prop>: v}}``."""
        if not isinstance(raw, dict):
            return raw
        overrides = _per_listener(raw)
        # A malformed listener.name.* key stays, to be reported as an unknown key.
        flat = {k: v for k, v in raw.items() if _listener_key(k) is None}
        if overrides:
            flat["listener.name"] = overrides
        return flat

    def group_size_config(self) -> GroupSizeConfig:
        return _group_size_config(self.flat())

    @field_validator("max_connections_per_ip_overrides")
    @classmethod
    def _overrides_parse(cls, value: str) -> str:
        parse_ip_overrides(value)
        return value

    def connection_limits(self) -> ConnectionLimits:
        return _connection_limits(self.flat())

    def identifier_limits(self) -> IdentifierLimits:
        return IdentifierLimits(
            enabled=self.resource_identifier_limit_enable,
            max_length=self.resource_identifier_max_length,
            member_id_max_length=self.member_id_max_length,
            classic_member_id_max_length=self.classic_member_id_max_length,
            topic_name_max_length=self.topic_name_max_length,
            offset_metadata_max_bytes=self.offset_metadata_max_bytes,
            error_code=self.resource_identifier_limit_error_code,
        )

    def mode_of(self, policy_mode: PolicyMode | None) -> PolicyMode:
        return policy_mode or self.mode

    def max_response_size_for(self, listener: str) -> int:
        override = self.listener_overrides.get(listener)
        if override is not None and override.max_response_size is not None:
            return override.max_response_size
        return self.max_response_size

    def flat(self) -> dict[str, Any]:
        """The policies as written in the file: Kafka property names, listener keys flattened."""
        out = self.model_dump(mode="json", by_alias=True, exclude={"listener_overrides"})
        for listener, props in self.listener_overrides.items():
            for prop, value in props.model_dump(by_alias=True, exclude_none=True).items():
                out[f"{LISTENER_PREFIX}{listener}.{prop}"] = value
        return out


class AuditWindow(_Frozen):
    seconds: float = Field(default=60, gt=0, le=86400, description="Length of an observation window.")


def _writable_directory(value: str | None) -> str | None:
    """``audit.path``: a directory this process can write (created if missing)."""
    if value is None:
        return None
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"must be a directory; {value!r} is a file") from None
    except OSError as exc:
        raise ValueError(f"cannot create directory {value!r}: {exc.strerror}") from None
    try:
        # A real write, not os.access: root passes access checks on read-only mounts.
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise ValueError(f"directory {value!r} is not writable: {exc.strerror}") from None
    return value


# What the audit producer runs with unless ``audit.producer`` says otherwise (librdkafka names):
# idempotent (no duplicates on retry), compressed, batched, and bounded in memory and time so
# that a slow or down broker costs dropped, counted events, never the proxy's memory.
AUDIT_PRODUCER_DEFAULTS: dict[str, str | int | bool] = {
    "enable.idempotence": True,
    "compression.type": "zstd",
    "linger.ms": 200,
    "queue.buffering.max.kbytes": 16384,
    "queue.buffering.max.messages": 100000,
    "message.timeout.ms": 120000,
    "client.id": "kafka-admission-proxy-audit",
}
# Applied when the proxy creates the audit topic (Kafka topic configs): a week of evidence, the
# report's default --min-span, then deleted.
AUDIT_TOPIC_CONFIG_DEFAULTS: dict[str, str] = {"retention.ms": "604800000", "cleanup.policy": "delete"}
_AUDIT_PRODUCER_OWN_KEYS = ("bootstrap.servers", "metadata.broker.list")


class _Quiet:
    def log(self, level: int, msg: str, *args: object) -> None:
        pass


def _librdkafka_accepts(value: dict[str, Any]) -> dict[str, Any]:
    """``audit.producer``: librdkafka producer properties, checked by librdkafka itself (a producer
    is built without brokers: nothing connects) when confluent-kafka is installed."""
    for key in _AUDIT_PRODUCER_OWN_KEYS:
        if key in value:
            raise ValueError(f"{key!r} is set by audit.bootstrap_servers, not here")
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError:
        return value  # the sink says so at start; check-config of a file sink must not need it
    try:
        Producer({**AUDIT_PRODUCER_DEFAULTS, **value, "logger": _Quiet()})  # "no bootstrap.servers": true here
    except (KafkaException, TypeError, ValueError) as exc:
        detail = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
        raise ValueError(f"librdkafka refuses it: {detail}") from None
    return value


def _topic_keys_need_a_topic(v: Mapping[str, Any]) -> None:
    if v["topic"] is None:
        set_keys = [k for k in ("bootstrap_servers", "producer", "topic_config") if v[k]]
        if set_keys:
            verb = "needs" if len(set_keys) == 1 else "need"
            raise ValueError(f"audit.{', audit.'.join(set_keys)} {verb} audit.topic (the audit topic's name)")


def upstream_tls_for_librdkafka(tls: UpstreamTls | None) -> dict[str, str | int | float | bool]:
    """``upstream.tls`` as librdkafka properties, so the audit topic on the upstream's brokers is
    reached as the proxy reaches them: verified TLS, and its client certificate when it has one.
    (librdkafka verifies the host it dials: ``server_hostname`` has no equivalent there, and a
    config that sets it must give ``audit.producer`` its own ssl.* keys: checked at load.)"""
    if tls is None or not tls.enabled:
        return {}
    out: dict[str, str | int | float | bool] = {"security.protocol": "ssl"}
    if tls.ca_file is not None:
        out["ssl.ca.location"] = tls.ca_file
    if tls.cert_file is not None and tls.key_file is not None:
        out["ssl.certificate.location"] = tls.cert_file
        out["ssl.key.location"] = tls.key_file
        password, _ = read_key_password(tls.key_password_file, tls.key_password_env)
        if password is not None:
            out["ssl.key.password"] = password.decode()
    return out


class Audit(_Frozen):
    """The evidence sink (proxy/evidence/audit.py): rotated JSON-line files in ``path`` and/or the Kafka
    topic ``topic`` (proxy/evidence/audit_kafka.py); the log when neither is set."""

    path: str | None = Field(
        default=None,
        description="A directory of rotated JSON-line files (created if missing); null (and no topic): the log.",
    )
    # Kafka's legal topic names (Topic.java): at most 249 of [a-zA-Z0-9._-].
    topic: str | None = Field(
        default=None,
        pattern=r"^[a-zA-Z0-9._-]{1,249}$",
        description="A Kafka topic for the events, beside or instead of path.",
    )
    bootstrap_servers: tuple[str, ...] = Field(
        default=(),
        strict=False,
        description="The topic's brokers, reached directly (no policy applies); empty: upstream.bootstrap_servers, "
        "with upstream.tls.",
    )
    producer: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="librdkafka producer properties over the defaults (enable.idempotence, zstd, linger.ms 200, "
        "16 MiB buffer): security.protocol, ssl.*, sasl.*, ...",
    )
    topic_config: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description="When the proxy creates the topic: topic configs over retention.ms 604800000 (7 days) and "
        "cleanup.policy delete.",
    )
    topic_partitions: int = Field(
        default=-1, ge=-1, le=100000, description="When the proxy creates the topic; -1: the broker's num.partitions."
    )
    topic_replication_factor: int = Field(
        default=-1,
        ge=-1,
        le=32767,
        description="When the proxy creates the topic; -1: the broker's default.replication.factor.",
    )
    instance_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="Names this proxy's files and events (safe in a file name); null: the hostname.",
    )
    max_file_bytes: int = Field(
        default=67108864,
        ge=4096,
        le=2**40,
        description="A file is finished (.jsonl.open renamed .jsonl) at this size...",
    )
    max_file_seconds: float = Field(default=3600, gt=0, le=7 * 86400, description="... or this age.")
    max_total_bytes: int = Field(
        default=1073741824,
        ge=4096,
        le=2**50,
        description="This instance's oldest files are deleted beyond this (at least max_file_bytes).",
    )
    queue_events: int = Field(
        default=65536,
        ge=1,
        le=16777216,
        description="Events waiting for each sink's writer; beyond it they are dropped and counted.",
    )
    window: AuditWindow = Field(
        default=AuditWindow(),
        description="Observation windows (sizes, groups, pool, connections, identifiers): evidence for the report.",
    )

    _path = field_validator("path")(_writable_directory)
    _producer = field_validator("producer")(_librdkafka_accepts)
    cross_field_rules = (
        CrossFieldRule(("topic", "bootstrap_servers", "producer", "topic_config"), _topic_keys_need_a_topic),
    )

    _addresses = field_validator("bootstrap_servers")(_bootstrap_addresses)

    @field_validator("topic_partitions", "topic_replication_factor")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("must be -1 (the broker's default) or at least 1, got 0")
        return value

    @field_validator("max_total_bytes")
    @classmethod
    def _a_file_fits_the_total(cls, value: int, info: ValidationInfo) -> int:
        file_bytes = info.data.get("max_file_bytes")
        if file_bytes is not None and value < file_bytes:
            raise ValueError(f"must be >= max_file_bytes ({file_bytes}), got {value}")
        return value

    @property
    def instance(self) -> str:
        return self.instance_id or socket.gethostname()

    def producer_config(self, upstream: Upstream) -> dict[str, str | int | float | bool]:
        """The audit producer's librdkafka config: the defaults, the upstream's TLS when the topic
        lives on the upstream's brokers, then ``producer``, then the brokers. Reads the upstream
        key's password, if it has one (KeyPasswordError when it cannot)."""
        tls = upstream_tls_for_librdkafka(upstream.tls) if not self.bootstrap_servers else {}
        servers = self.bootstrap_servers or upstream.bootstrap_servers
        return {**AUDIT_PRODUCER_DEFAULTS, **tls, **self.producer, "bootstrap.servers": ",".join(servers)}

    @property
    def new_topic_config(self) -> dict[str, str]:
        given = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.topic_config.items()}
        return {**AUDIT_TOPIC_CONFIG_DEFAULTS, **given}


def _raw_listeners(v: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = v.get("listeners")
    return [item for item in items if isinstance(item, Mapping)] if isinstance(items, list) else []


def _raw_listener_names(v: Mapping[str, Any]) -> list[str]:
    return [item["name"] for item in _raw_listeners(v) if isinstance(item.get("name"), str)]


def _distinct(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _repeated(items: list[Any]) -> list[Any]:
    return sorted({item for item in items if items.count(item) > 1}, key=str)


def _listener_names_unique(v: Mapping[str, Any]) -> None:
    repeated = _repeated(_raw_listener_names(v))
    if repeated:
        raise ValueError(f"listener names must be unique: {', '.join(repeated)} more than once")


def _listener_binds_unique(v: Mapping[str, Any]) -> None:
    binds = []
    for item in _raw_listeners(v):
        try:
            binds.append(_host_port(item["bind"], "bind"))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a missing or malformed bind has its own error
    repeated = _repeated(binds)
    if repeated:
        where = ", ".join(f"{host}:{port}" for host, port in repeated)
        raise ValueError(f"listener bind addresses must be unique: {where} more than once")


def _per_listener_keys_name_listeners(v: Mapping[str, Any]) -> None:
    policies = v.get("policies")
    if not isinstance(policies, Mapping):
        return
    names = _distinct(_raw_listener_names(v))
    unknown = sorted({parts[0] for key in policies if (parts := _listener_key(key)) and parts[0] not in names})
    if unknown:
        keys = ", ".join(f"{LISTENER_PREFIX}{name}.*" for name in unknown)
        verb = "names" if len(unknown) == 1 else "name"
        raise ValueError(f"policies: {keys} {verb} no configured listener (have: {names})")


# The per-listener keys that need no Kafka frame: the only ones a passthrough listener takes.
_CONNECTION_LEVEL_KEYS = frozenset({MAX_CONNECTIONS})


def _passthrough_listeners_take_connection_policies_only(v: Mapping[str, Any]) -> None:
    """A key written for a passthrough listener (``listener.name.<l>.<prop>``) that needs
    Kafka frames is an error: it was meant for that listener and could never act there.
    A broker-wide frame-level key is not: it applies to the other listeners (as Kafka's
    broker-wide defaults do) and, as documented, to no passthrough listener."""
    policies = v.get("policies")
    passthrough = {item.get("name") for item in _raw_listeners(v) if item.get("tls") == PASSTHROUGH}
    if not isinstance(policies, Mapping) or not passthrough:
        return
    lines = [
        f"policies: {key}: listener {parts[0]} is tls: passthrough (its bytes are not decrypted), "
        f"so {parts[1]} cannot apply to it; only {', '.join(sorted(_CONNECTION_LEVEL_KEYS))} can"
        for key in policies
        if (parts := _listener_key(key)) and parts[0] in passthrough and parts[1] not in _CONNECTION_LEVEL_KEYS
    ]
    if lines:
        raise ValueError("\n".join(lines))


def _sidecar_passthrough_has_one_broker(v: Mapping[str, Any]) -> None:
    if v.get("mode", "cluster") != "sidecar":
        return
    for i, item in enumerate(_raw_listeners(v)):
        brokers = item.get("passthrough_brokers")
        if item.get("tls") == PASSTHROUGH and isinstance(brokers, Mapping) and len(brokers) > 1:
            raise ValueError(
                f"listeners[{i}].passthrough_brokers: mode: sidecar relays to its one broker, got {len(brokers)}"
            )


def _audit_topic_can_take_the_upstream_tls(v: Mapping[str, Any]) -> None:
    audit, upstream = v.get("audit"), v.get("upstream")
    if not isinstance(audit, Mapping) or not isinstance(upstream, Mapping) or not audit.get("topic"):
        return
    tls = upstream.get("tls")
    if audit.get("bootstrap_servers") or not isinstance(tls, Mapping) or tls.get("enabled") is not True:
        return
    if tls.get("server_hostname") is not None:
        raise ValueError(
            "audit.topic on the upstream's brokers: upstream.tls.server_hostname has no librdkafka equivalent "
            "(it verifies the host it dials); set audit.bootstrap_servers to names the brokers' certificates "
            "carry, with audit.producer's ssl.* keys"
        )


class Config(_Frozen):
    mode: Literal["cluster", "sidecar"] = Field(
        default="cluster",
        description="cluster: in front of a whole cluster, broker addresses rewritten to this proxy; sidecar: one "
        "proxy per broker pod, addresses passed through.",
    )
    workers: int | Literal["auto"] = Field(
        default=1,
        description="Worker processes serving the same ports (SO_REUSEPORT) under one supervisor that keeps every "
        "limit exact across them; auto: the CPUs this process may use (CPU affinity, capped by the cgroup's CPU "
        "quota). 1 runs the proxy as one process.",
    )
    upstream: Upstream = Field(description="The brokers.")
    listeners: tuple[Listener, ...] = Field(
        min_length=1, strict=False, description="Where clients connect."
    )  # a YAML list
    admin: Admin = Field(default=Admin(), description="The admin HTTP endpoint.")
    policies: Policies = Field(
        default=Policies(), description="Kafka broker properties, by their Kafka names, and each policy's mode."
    )
    audit: Audit = Field(default=Audit(), description="The evidence sink: audit events and observation windows.")

    # Read from the YAML as written, so they are reported even when a listener or a
    # policy has errors of its own.
    cross_field_rules = (
        CrossFieldRule((), _listener_names_unique),
        CrossFieldRule((), _per_listener_keys_name_listeners),
        CrossFieldRule((), _listener_binds_unique),
        CrossFieldRule((), _passthrough_listeners_take_connection_policies_only),
        CrossFieldRule((), _sidecar_passthrough_has_one_broker),
        CrossFieldRule((), _audit_topic_can_take_the_upstream_tls),
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        # One line naming the key (a union would report each of its arms).
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be an integer >= 1 or 'auto', got {_shown(value)}")

    def tls_files(self) -> list[TlsFiles]:
        """The TLS files of every section that has them (the client certificate toward brokers
        is labelled ``upstream``)."""
        sections = [
            TlsFiles(
                f"listeners[{i}].tls",
                lst.name,
                term.cert_file,
                term.key_file,
                term.ca_file,
                term.key_password_file,
                term.key_password_env,
            )
            for i, lst in enumerate(self.listeners)
            if (term := lst.termination) is not None
        ]
        tls = self.upstream.tls
        if tls.enabled:
            sections.append(
                TlsFiles(
                    "upstream.tls",
                    UPSTREAM_CERTIFICATE,
                    tls.cert_file,
                    tls.key_file,
                    tls.ca_file,
                    tls.key_password_file,
                    tls.key_password_env,
                )
            )
            if tls.client_identity is not None:
                identity = tls.client_identity
                sections.append(
                    TlsFiles(
                        "upstream.tls.client_identity",
                        IDENTITY_CA_CERTIFICATE,
                        identity.ca_cert_file,
                        identity.ca_key_file,
                        None,
                        field_prefix="ca_",
                        issues_certificates=True,
                    )
                )
        return sections

    def effective(self) -> dict[str, Any]:
        """The config with every default filled in, under the file's own key names."""
        out = self.model_dump(mode="json", by_alias=True, exclude={"policies"})
        out["policies"] = self.policies.flat()
        return {key: out[key] for key in ("mode", "workers", "upstream", "listeners", "admin", "policies", "audit")}


def _known_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model that owns the key at ``loc``, to suggest its valid keys."""
    model: type[BaseModel] = Config
    skip_key = False
    for part in loc[:-1]:
        if isinstance(part, int) or skip_key:
            skip_key = False
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            field = next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return None
        inner = _model_of(field.annotation)
        if inner is None:
            return None
        skip_key = getattr(field.annotation, "__origin__", None) is dict  # next part is a dict key
        model = inner
    return model


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _sections_knowing(key: str) -> list[str]:
    """The top-level sections in which ``key`` is a valid key."""
    sections = []
    for section, field in Config.model_fields.items():
        model = _model_of(field.annotation)
        if model is not None and (key in _known_keys(model) or (model is Policies and _listener_key(key))):
            sections.append(f"{section}:")
    return sections


def _unknown_key_hint(loc: tuple[int | str, ...]) -> str:
    key = str(loc[-1])
    if "password" in key:
        return "; passwords are never written in the config: use key_password_file or key_password_env"
    if len(loc) == 1:
        sections = _sections_knowing(key)
        if sections:
            return f" at the top level; it belongs under {' or '.join(sections)}"
    if key.startswith(LISTENER_PREFIX) and _listener_key(key) is None:
        return "; write per-listener keys as listener.name.<listener>.<property>"
    model = _model_at(loc)
    if model is not None:
        close = difflib.get_close_matches(key, _known_keys(model), n=1)
        if close:
            return f" (did you mean {close[0]!r}?)"
    return ""


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(error: Any) -> str:
    loc = tuple(part for part in error["loc"] if part not in (_TERMINATION_TAG, _PASSTHROUGH_TAG))
    key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
    value = error.get("input")
    if _PASSTHROUGH_TAG in error["loc"]:
        message = f"must be a mapping (cert_file, key_file, ...) or 'passthrough', got {_shown(value)}"
    elif error["type"] == "extra_forbidden":
        message = f"unknown key{_unknown_key_hint(loc)}"
    elif error["type"] == "int_type" and isinstance(value, str):
        message = f"must be an integer, got the string {_shown(value)} (write numbers without quotes)"
    elif error["type"] == "int_type" and isinstance(value, bool | float):
        message = f"must be an integer, got {str(value).lower() if isinstance(value, bool) else value}"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def parse_config(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping")
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # A list whose items failed also reports itself as too short: say the cause only.
        shown = [
            e
            for e in errors
            if not (
                e["type"] == "too_short"
                and any(len(o["loc"]) > len(e["loc"]) and o["loc"][: len(e["loc"])] == e["loc"] for o in errors)
            )
        ]
        raise ConfigError("\n".join(_describe(e) for e in shown)) from None
    _check_certificates(config)
    return config


def _check_certificates(config: Config) -> None:
    """TLS files that exist but cannot serve (key mismatch, chain order, dates): one line each."""
    problems = certificate_problems(config.tls_files())
    if problems:
        raise ConfigError("\n".join(problems))


# ``${NAME}`` in a string value is the environment's NAME, so one file serves every pod
# (Strimzi's per-broker ``<pod>.crt``, with POD_NAME from the downward API). ``$${`` writes a
# literal ``${``; any other ``$`` is itself (regex anchors stay as written).
_ENV_REFERENCE = re.compile(r"\$(\$)?\{([^}]*)\}?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_RULE = "${NAME} is expanded from the environment at load; write $${ for a literal ${"


def _expand_string(value: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    problems: list[str] = []

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return match.group(0)[1:]
        if not match.group(0).endswith("}") or not _ENV_NAME.fullmatch(name):
            problems.append(f"malformed reference {match.group(0)!r}")
            return match.group(0)
        if name not in environ:
            problems.append(f"environment variable {name!r} is not set")
            return match.group(0)
        return environ[name]

    return _ENV_REFERENCE.sub(replace, value), problems


def expand_environment(raw: Any, environ: Mapping[str, str]) -> Any:
    """``raw`` (the YAML as read) with every ``${NAME}`` in its string values replaced, once:
    an expanded value is not expanded again. Keys stay as written. Every reference that
    cannot be expanded is an error line naming the key path, the variable and the rule."""
    problems: list[str] = []

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            return {key: walk(value, f"{path}.{key}" if path else str(key)) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item, f"{path}[{i}]") for i, item in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            expanded, found = _expand_string(node, environ)
            problems.extend(f"{path or '<config>'}: {problem} ({_ENV_RULE})" for problem in found)
            return expanded
        return node

    expanded = walk(raw, "")
    if problems:
        raise ConfigError("\n".join(problems))
    return expanded


def parse_config_text(text: str, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Config:
    """A config from YAML text; ``source`` (its file name) is named in YAML errors. ``${NAME}``
    references are expanded from ``environ`` (the process environment unless given), read
    again at every load, so a reload sees the environment as it is then."""
    try:
        raw = read_yaml(text, source)
    except StrictYamlError as exc:
        raise ConfigError(str(exc)) from None
    return parse_config(expand_environment(raw, os.environ if environ is None else environ))


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read config file {str(path)!r}: {reason}") from None
    return parse_config_text(text, str(path))
