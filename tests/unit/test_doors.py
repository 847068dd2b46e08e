"""The HTTP doors' decisions (vox_mqtt/console/doors.py; docs/security.md, F27 and F29)."""

from __future__ import annotations

import pytest

from vox_mqtt.console.doors import (
    BACKLOG,
    DoorCounters,
    DoorLimits,
    check_allowed_host,
    connection_cap,
    expired,
    host_of,
    host_rule,
    victim,
)

REBIND = "rebind.attacker.example"


def test_a_host_header_is_read_as_its_host_without_port_or_brackets() -> None:
    assert host_of("127.0.0.1") == "127.0.0.1"
    assert host_of("127.0.0.1:8080") == "127.0.0.1"
    assert host_of("[::1]") == "::1"
    assert host_of("[::1]:8080") == "::1"
    assert host_of("[0:0:0:0:0:0:0:1]:80") == "::1"  # an IP literal in its normal form
    assert host_of("LocalHost.:8080") == "localhost"
    assert host_of(" Console.Example.ORG ") == "console.example.org"
    for bad in ("", "::1", "[::1", "[::1]x", "[127.0.0.1]", "a:b", "a:80:90", "a b", "a/b", "[x]"):
        assert host_of(bad) is None, bad


def test_a_loopback_door_answers_its_own_address_and_localhost_only() -> None:
    rule = host_rule("127.0.0.1")
    for header in ("127.0.0.1", "127.0.0.1:8080", "127.0.0.1:9999", "localhost:8080"):
        assert rule.allows(header), header  # any port: an SSH tunnel shows its own
    for refused in (REBIND, f"{REBIND}:8080", "127.0.0.2", "[::1]", "", None, "127.0.0.1:x"):
        assert not rule.allows(refused), refused


def test_an_ipv6_door_answers_its_address_in_brackets_never_any_host() -> None:
    rule = host_rule("::1")
    for header in ("[::1]", "[::1]:8080", "[0::1]:1", "localhost"):
        assert rule.allows(header), header
    for header in (REBIND, "127.0.0.1", "::1", "[::2]:8080"):
        assert not rule.allows(header), header


def test_another_loopback_address_answers_for_itself() -> None:
    rule = host_rule("127.0.0.2")
    assert rule.allows("127.0.0.2:8080")
    assert rule.allows("localhost")
    assert not rule.allows("127.0.0.1:8080")
    assert not rule.allows(REBIND)


def test_a_wildcard_door_answers_ip_literals_and_given_names_only() -> None:
    for listen in ("0.0.0.0", "::"):
        rule = host_rule(listen, ["console.example.org"])
        for header in ("192.0.2.7:8080", "[2001:db8::1]", "localhost", "Console.Example.Org"):
            assert rule.allows(header), (listen, header)
        assert not rule.allows(REBIND)
        assert not rule.allows("other.example.org")


def test_a_named_door_and_allowed_names() -> None:
    rule = host_rule("console.lan", ["proxy.example.org", "192.0.2.9", "[2001:db8::9]"])
    for header in ("console.lan", "console.lan:8080", "proxy.example.org", "192.0.2.9:443"):
        assert rule.allows(header), header
    assert rule.allows("[2001:db8::9]:443")
    for header in (REBIND, "localhost", "192.0.2.10"):
        assert not rule.allows(header), header
    assert host_rule("localhost").allows("127.0.0.1:1")
    assert host_rule("localhost").allows("[::1]")
    assert not host_rule("localhost").allows(REBIND)


def test_an_allowed_host_is_a_name_or_an_address_without_port() -> None:
    assert check_allowed_host("Console.Example.Org") == "console.example.org"
    assert check_allowed_host("[2001:db8::1]") == "2001:db8::1"
    assert check_allowed_host("2001:db8::1") == "2001:db8::1"
    for bad in ("console.example.org:8080", "*.example.org", "", "a b", "http://x"):
        with pytest.raises(ValueError, match="--allowed-host"):
            check_allowed_host(bad)


def test_a_new_connection_at_the_cap_closes_the_oldest_without_a_request_in_flight() -> None:
    assert victim([], 2) is None
    assert victim([True], 2) is None  # under the cap: nothing closed
    assert victim([True, False, False], 3) == 1  # the oldest idle or half-open one
    assert victim([False, True], 2) == 0
    assert victim([True, True], 2) == -1  # every one busy: the new one is refused


def test_a_connection_expires_without_a_whole_head_or_body_in_time() -> None:
    limits = DoorLimits(header_timeout=10, body_timeout=30)
    assert not expired(109.9, 100, busy=False, body_pending=False, limits=limits)
    assert expired(110.1, 100, busy=False, body_pending=False, limits=limits)
    assert not expired(129, 100, busy=True, body_pending=True, limits=limits)
    assert expired(131, 100, busy=True, body_pending=True, limits=limits)
    # An event stream: a request in flight with its whole body never expires here.
    assert not expired(10_000, 100, busy=True, body_pending=False, limits=limits)


def test_the_cap_leaves_descriptors_for_the_backlog_and_the_process() -> None:
    assert connection_cap(256, 1024) == 256
    assert connection_cap(5000, 1024) == 1024 - BACKLOG - 64
    assert connection_cap(256, 200) == 8  # a tiny limit still serves a few
    assert connection_cap(256, -1) == 256  # RLIM_INFINITY


def test_the_counters_are_exposed_as_prometheus_text() -> None:
    counters = DoorCounters(open=3, evicted=2, timed_out=5)
    text = counters.exposition("vox_exporter_http_connections").decode()
    assert "vox_exporter_http_connections_open 3\n" in text
    assert 'vox_exporter_http_connections_closed_total{reason="evicted"} 2\n' in text
    assert 'vox_exporter_http_connections_closed_total{reason="timed_out"} 5\n' in text
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == {"vox_exporter_http_connections_open", "vox_exporter_http_connections_closed"}
