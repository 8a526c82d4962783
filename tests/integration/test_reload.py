"""A config reload applies every policy key to the connections already open, at
their next frame: a new config generation is swapped in by one reference.
Restart-only keys keep their running value and are named; an invalid file
changes nothing. A reload comes from SIGHUP after an edit, or from the file
watcher alone when a ConfigMap volume is updated as kubelet does it (tests
parametrized ``[sighup]`` / ``[configmap]``); each is counted by outcome."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.clients import Member, create_topic, refused, unique, wait_for
from tests.conftest import wait_until
from tests.faults import StoppedClient
from tests.integration.test_group_size_through_proxy import coordinator_members, settled
from tests.raw_kafka import RawConnection, api_versions_frame, frame, metadata_frame


def test_identifier_limits_turned_on_apply_to_a_connection_already_open(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1, client_id="c" * 250))
        assert conn.read_response(18, 3).body.error_code == 0  # no limit yet
        proxy.reload(**{"resource.identifier.limit.enable": True})
        conn.send(api_versions_frame(2, client_id="c" * 250))
        response = conn.read_response(18, 3)
        assert (response.header.correlation_id, response.body.error_code) == (2, 42)
        assert conn.closed_by_peer()  # a client id over the limit taints the connection
    assert proxy.metric("kafka_admission_decisions_total", policy="identifier_limits", action="refuse") == 1


def test_an_open_connection_sees_a_reloaded_connections_max_idle_ms(tansu: Any, start_proxy: Any) -> None:
    """A client that stops reading its responses (its connection busy, so the idle reaper leaves
    it) is held while connections.max.idle.ms is 10 minutes. A reload lowers it to 1 s: the
    send to that client, opened and waiting before the reload, stalls out by the new value
    within seconds. Before, the value was copied when the connection opened (10 minutes)."""
    proxy = start_proxy(tansu.bootstrap, policies={"connections.max.idle.ms": 600000})
    client = StoppedClient(proxy.bootstrap, "unread")
    try:
        assert client.sent > 1000  # it got ahead of the proxy, whose send to it now waits
        assert proxy.metric("kafka_admission_connections_active") == 1
        proxy.reload(**{"connections.max.idle.ms": 1000})
        wait_until(lambda: proxy.metric("kafka_admission_connections_active") == 0, timeout=15)
        closes = proxy.metric("kafka_admission_decisions_total", action="close", limit="connections.max.idle.ms")
        assert closes == 1
    finally:
        client.kill()


def test_a_lowered_max_response_size_applies_to_a_connection_already_open(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap)
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(metadata_frame(1))
        assert conn.read_response(3, 12).header.correlation_id == 1
        proxy.reload(**{"max.response.size": 16})  # any Metadata answer is larger
        conn.send(metadata_frame(2))
        assert conn.closed_by_peer()
    assert proxy.metric("kafka_admission_decisions_total", policy="response_size", mode="enforce") == 1
    assert "over max.response.size=16" in proxy.log()


def test_a_raised_socket_request_max_bytes_applies_to_a_connection_already_open(tansu, start_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, policies={"socket.request.max.bytes": 4096})
    m: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    topics = tuple(m.MetadataRequestTopic(name=f"t{i:030d}", topic_id=None) for i in range(200))
    body = m.MetadataRequest(topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    big = frame(3, 12, 2, body)
    assert len(big) > 4096
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(metadata_frame(1))
        assert conn.read_response(3, 12).header.correlation_id == 1
        proxy.reload(**{"socket.request.max.bytes": 1048576})
        conn.send(big)
        assert conn.read_response(3, 12).header.correlation_id == 2  # answered by the broker, not refused
    assert proxy.metric("kafka_admission_decisions_total", policy="request_size") == 0


RELOAD_OUTCOMES = ("success", "invalid", "restart_required", "error")


def last_success(proxy: Any) -> float:
    return float(proxy.metric("kafka_admission_config_last_reload_success_timestamp_seconds"))


def counted(**outcomes: int) -> dict[str, float]:
    """What ``kafka_admission_config_reloads_total`` should read: these outcomes, the rest 0."""
    return {outcome: outcomes.get(outcome, 0) for outcome in RELOAD_OUTCOMES}


def reload_successful(proxy: Any) -> float:
    return float(proxy.metric("kafka_admission_config_last_reload_successful"))


def test_the_reload_gauges_say_a_stale_config_runs_until_a_good_reload(tansu, start_proxy, configmap) -> None:  # type: ignore[no-untyped-def]
    """As Prometheus reports its own reloads: ``..._last_reload_successful`` is 0 from a
    refused reload (invalid, or a key that needs a restart) until one applies all of the
    file, and only that one moves the success timestamp."""
    proxy = start_proxy(tansu.bootstrap, configmap=configmap)
    started = last_success(proxy)
    assert reload_successful(proxy) == 1  # the config loaded at start is the file
    proxy.reload("policies: {group.max.size: -5}\n" + yaml.safe_dump(proxy.config), expect="invalid")
    assert (reload_successful(proxy), last_success(proxy)) == (0, started)
    proxy.reload(yaml.safe_dump({**proxy.config, "admin": {"bind": "127.0.0.1:1"}}), expect="restart_required")
    assert (reload_successful(proxy), last_success(proxy)) == (0, started)  # still stale: admin.bind
    proxy.reload(yaml.safe_dump(proxy.config))
    assert reload_successful(proxy) == 1 and last_success(proxy) > started
    proxy.reload("{", expect="invalid")
    assert reload_successful(proxy) == 0
    assert proxy.reloads() == counted(invalid=2, restart_required=1, success=1)


def test_a_restart_only_change_is_named_and_the_rest_applies(tansu, start_proxy, configmap) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, configmap=configmap)
    started = last_success(proxy)
    changed = {
        **proxy.config,
        "admin": {"bind": "127.0.0.1:1"},
        "policies": {"resource.identifier.limit.enable": True},
    }
    proxy.reload(yaml.safe_dump(changed), expect="restart_required")
    assert "config reload: admin.bind changed; restart to apply it (the rest applies)" in proxy.log()
    status, _ = proxy.get("/healthz")  # still on its old admin port
    assert status == 200
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1, client_id="c" * 250))
        assert conn.read_response(18, 3).body.error_code == 42  # the policy change applied
    # Not all of the file runs: not a success, and the time of the last one stays.
    assert last_success(proxy) == started
    # The file as it runs (admin.bind back): a success.
    proxy.reload(**{"resource.identifier.limit.enable": True})
    assert last_success(proxy) > started
    assert proxy.reloads() == counted(restart_required=1, success=1)


def test_an_invalid_file_changes_nothing_and_the_proxy_keeps_serving(tansu, start_proxy, configmap) -> None:  # type: ignore[no-untyped-def]
    proxy = start_proxy(tansu.bootstrap, configmap=configmap)
    started = last_success(proxy)
    proxy.reload("policies: {group.max.size: -5}\n" + yaml.safe_dump(proxy.config), expect="invalid")
    assert "config reload refused, keeping the running config" in proxy.log()
    assert "policies.group.max.size: Input should be greater than or equal to 1" in proxy.log()
    with RawConnection(proxy.bootstrap) as conn:
        conn.send(api_versions_frame(1))
        assert conn.read_response(18, 3).body.error_code == 0
    assert last_success(proxy) == started
    assert proxy.reloads() == counted(invalid=1)


def test_a_sighup_after_an_edit_reloads_once_and_the_file_watcher_does_not_reload_it_again(  # type: ignore[no-untyped-def]
    tansu, start_proxy, certs, tmp_path
) -> None:
    """The watcher reports changed files in order, naming each changed since its last report.
    After the SIGHUP, a later change to another watched file (the certificate, replaced) is
    reported: had the watcher kept the edited config as unread, that report, or one before
    it, would name the config file too."""
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(Path(certs.server_cert).read_bytes())
    key.write_bytes(Path(certs.server_key).read_bytes())
    listeners = [{"name": "plain"}, {"name": "tls", "tls": {"cert_file": str(cert), "key_file": str(key)}}]
    proxy = start_proxy(tansu.bootstrap, listeners=listeners)
    proxy.reload(**{"max.response.size": 1048576})
    assert proxy.reloads() == counted(success=1)

    renewed = tmp_path / "renewed.pem"  # the same certificate, renewed as cert-manager does: a new file
    renewed.write_bytes(cert.read_bytes())
    renewed.replace(cert)
    wait_until(lambda: proxy.reloads() == counted(success=2), timeout=8)
    reports = re.findall(r"watched files changed files=(\S+)", proxy.log())
    assert reports == [str(cert)]


def test_a_lowered_group_max_size_and_a_switched_mode_are_enforced_for_a_new_member(  # type: ignore[no-untyped-def]
    tansu, start_proxy, configmap
) -> None:
    proxy = start_proxy(
        tansu.bootstrap, configmap=configmap, policies={"group.max.size": 4, "group.size.mode": "observe"}
    )
    topic, group = unique("reload-gs"), unique("reloaded")
    create_topic(proxy.bootstrap, topic, partitions=4)
    members = [Member(proxy.bootstrap, topic, group) for _ in range(3)]
    try:
        assert wait_for(lambda: all(m.has_assignment() for m in members), timeout=40)
        assert wait_for(lambda: settled(tansu.bootstrap, group, 3))
        assert proxy.metric("kafka_admission_decisions_total", policy="group_size") == 0  # under the cap
        proxy.reload(**{"group.max.size": 2, "group.size.mode": "enforce"})
        # A fourth member is refused (the coordinator never sees it): at the old cap, or in
        # observe mode, it would have been let in. The three already in keep their places,
        # as in Kafka, where a group over a lowered cap shrinks only at its next rebalance
        # (see the group size policy's module docstring).
        fourth = Member(proxy.bootstrap, topic, group)
        members.append(fourth)
        assert wait_for(lambda: refused(fourth), timeout=40), fourth.errors
        assert (
            proxy.metric("kafka_admission_decisions_total", policy="group_size", limit="group.max.size", mode="enforce")
            >= 1
        )
        assert coordinator_members(tansu.bootstrap, group) == 3
        assert all(m.has_assignment() for m in members[:3])
    finally:
        for m in members:
            m.stop()
