"""What `vox broker reload` decides from a rendered mosquitto.conf: listeners, TLS SIGHUP."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vox_mqtt.broker.reload import conf_directives, listener_endpoints, tls_sighup_refusal
from vox_mqtt.broker.render import render_conf
from vox_mqtt.cli.broker import _watch_seconds
from vox_mqtt.protocol.errors import ConfigError

ROOT = Path("/etc/vox/broker")


def conf(fmt: str, tls_port: int | None) -> list[tuple[str, str]]:
    text = render_conf(
        root=ROOT,
        fmt=fmt,  # type: ignore[arg-type]
        bind="0.0.0.0",
        port=1883,
        tls_port=tls_port,
        run_as_user="mosquitto",
        plugin=Path("/usr/lib/mosquitto_dynamic_security.so"),
    )
    return conf_directives(text)


def test_every_listener_is_watched_a_wildcard_bind_on_loopback() -> None:
    assert listener_endpoints(conf("acl", None)) == (("127.0.0.1", 1883),)
    assert listener_endpoints(conf("acl", 8883)) == (("127.0.0.1", 1883), ("127.0.0.1", 8883))
    pairs = conf_directives("# listener 1\nlistener 1884 10.0.0.7\nlistener x\nlistener 1885\n")
    assert listener_endpoints(pairs) == (("10.0.0.7", 1884), ("127.0.0.1", 1885))


@pytest.mark.parametrize("fmt", ["acl", "dynsec"])
def test_a_tls_broker_with_certificates_as_usernames_is_not_signalled(fmt: str) -> None:
    line = tls_sighup_refusal(ROOT / "mosquitto.conf", conf(fmt, 8883))
    assert line is not None
    assert line.startswith("/etc/vox/broker/mosquitto.conf: refusing to SIGHUP a TLS broker")
    assert "--format dynsec" in line
    assert "--tls-sighup" in line


def test_a_plain_broker_may_be_signalled() -> None:
    assert tls_sighup_refusal(ROOT / "mosquitto.conf", conf("acl", None)) is None
    pairs = conf_directives("listener 8883\nuse_identity_as_username false\n")
    assert tls_sighup_refusal(ROOT / "mosquitto.conf", pairs) is None


def test_the_watch_window_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VOX_RELOAD_WATCH", raising=False)
    assert _watch_seconds(argparse.Namespace(watch=None)) == 20.0
    assert _watch_seconds(argparse.Namespace(watch=3.5)) == 3.5
    monkeypatch.setenv("VOX_RELOAD_WATCH", "0")
    assert _watch_seconds(argparse.Namespace(watch=None)) == 0.0
    assert _watch_seconds(argparse.Namespace(watch=5.0)) == 5.0
    monkeypatch.setenv("VOX_RELOAD_WATCH", "soon")
    with pytest.raises(ConfigError, match="VOX_RELOAD_WATCH='soon' is not a number"):
        _watch_seconds(argparse.Namespace(watch=None))
    with pytest.raises(ConfigError, match="--watch must be from 0 to 3600"):
        _watch_seconds(argparse.Namespace(watch=-1.0))
