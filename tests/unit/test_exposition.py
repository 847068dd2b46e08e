"""The exporter's kept text: byte for byte what prometheus_client renders, and kept while idle."""

from __future__ import annotations

import gc
import gzip
from typing import Any
from uuid import UUID, uuid4

from prometheus_client import generate_latest

from vox_mqtt.console.exporter import fleet_families
from vox_mqtt.console.exposition import CachedExposition, FamilyList, metrics_app
from vox_mqtt.observe.metrics import AgentMetrics
from vox_mqtt.observe.observer import FleetObserver
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import MSG_AGENT_STATUS, AgentStatus, new_message, serialize
from vox_mqtt.transport.session import Inbound

OPERATOR = uuid4()
NOW = 1e9  # one clock for both renderings: the heartbeat ages must agree


def status(
    agent: UUID, master: UUID, name: str, *, metrics: dict[str, Any], state: str = "ACTIVE"
) -> Inbound:
    report = AgentStatus(
        name=name,
        status=state,
        error_code=None if state == "ACTIVE" else "VM_CONNECTION_LOST",
        epoch=3,
        started_at="2026-01-01T00:00:00+00:00",
        heartbeat_interval=15.0,
        metrics=metrics,
    )
    message = new_message(MSG_AGENT_STATUS, source=agent, target=master, details=report)
    return Inbound(topic=topics.status(agent), payload=serialize(message), retain=True)


def snapshot(work: int) -> dict[str, Any]:
    metrics = AgentMetrics()
    metrics.messages_in.inc("command_request", 10 + work)
    metrics.rejected.inc("UNAUTHORIZED_SOURCE", work)
    metrics.commands_served.inc(f"cmd-{work % 3}", work)  # a new label value now and then
    metrics.duplicates = work
    for n in range(work):
        metrics.command_handler_seconds.observe(0.001 * (n + 1))
    metrics.gauge("ledger_bytes", lambda: 4096.0 * (work + 1))
    snap = metrics.snapshot()
    assert snap is not None
    return snap


def host(beat: int) -> dict[str, Any]:
    return {"cpu_percent": float(beat % 7), "memory_percent": 41.5, "uptime_s": 1000 + beat}


def reference(observer: FleetObserver) -> bytes:
    return generate_latest(FamilyList(fleet_families(observer, names={}, now=NOW)))


def test_kept_text_is_what_prometheus_client_renders_through_changes() -> None:
    observer = FleetObserver()
    root, a, b, quiet = uuid4(), uuid4(), uuid4(), uuid4()
    exposition = CachedExposition(observer, clock=lambda: NOW)
    assert exposition.body() == reference(observer)  # no agent yet: the headers alone
    for beat in range(6):
        observer.take(status(root, OPERATOR, "root", metrics=host(beat)))
        observer.take(status(a, root, "a", metrics={**host(beat), "agent": snapshot(beat)}))
        # b works only on even beats, and its master is renamed once (new labels).
        master_name = "root" if beat < 3 else "renamed-root"
        if beat == 3:
            observer.take(status(root, OPERATOR, master_name, metrics=host(beat)))
        observer.take(status(b, root, "b", metrics={**host(beat), "agent": snapshot(beat // 2)}))
        if beat == 0:
            # A snapshot of an unknown version and one with a hostile label: left out alike.
            observer.take(status(quiet, root, "quiet", metrics={"agent": {"v": 99}}))
        if beat == 4:
            observer.take(status(quiet, root, "quiet", metrics={}, state="INACTIVE"))
        if beat == 2:
            failure = SystemFailure(
                error_code="HEARTBEAT_STALE", severity="WARNING", description="late"
            )
            message = new_message(
                MSG_SYSTEM_FAILURE, source=root, target=topics.WARROOM_ID, details=failure
            )
            observer.take(
                Inbound(topic=topics.warroom(root, a), payload=serialize(message), retain=True)
            )
        assert exposition.body() == reference(observer), f"beat {beat}"
        assert exposition.body() == reference(observer), f"beat {beat}, no new status"


def test_an_idle_agent_is_not_rendered_again() -> None:
    observer = FleetObserver()
    agent = uuid4()
    exposition = CachedExposition(observer, clock=lambda: NOW)
    observer.take(status(agent, OPERATOR, "a", metrics={**host(0), "agent": snapshot(2)}))
    exposition.body()
    rendered = exposition.rendered_families
    assert rendered > 0
    for beat in range(1, 4):  # new heartbeats, new host figures, the same counters
        observer.take(status(agent, OPERATOR, "a", metrics={**host(beat), "agent": snapshot(2)}))
        assert exposition.body() == reference(observer)
    assert exposition.rendered_families == rendered
    # Work with the label values it already had: every line is known, nothing rendered,
    # and the snapshot's families are written from it without building them.
    built = exposition.built_families
    observer.take(status(agent, OPERATOR, "a", metrics={**host(9), "agent": snapshot(5)}))
    assert exposition.body() == reference(observer)
    assert exposition.rendered_families == rendered
    assert exposition.built_families == built
    # A new label value (cmd-0 after cmd-2): that family is built and rendered, and the
    # text is still prometheus_client's.
    observer.take(status(agent, OPERATOR, "a", metrics={**host(10), "agent": snapshot(6)}))
    assert exposition.body() == reference(observer)
    assert exposition.rendered_families > rendered
    assert exposition.built_families > built


def call(app: Any, method: str = "GET", encoding: str = "") -> tuple[str, dict[str, str], bytes]:
    seen: dict[str, Any] = {}

    def start_response(code: str, headers: list[tuple[str, str]]) -> None:
        seen["code"], seen["headers"] = code, dict(headers)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/metrics", "HTTP_ACCEPT_ENCODING": encoding}
    body = b"".join(app(environ, start_response))
    return seen["code"], seen["headers"], body


def test_metrics_app_serves_text_format_and_gzip_when_asked() -> None:
    app = metrics_app(lambda: b"vox_agent_up 1.0\n")
    code, headers, body = call(app)
    assert code == "200 OK"
    assert body == b"vox_agent_up 1.0\n"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    code, headers, body = call(app, encoding="gzip, deflate")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == b"vox_agent_up 1.0\n"
    assert int(headers["Content-Length"]) == len(body)
    code, headers, _ = call(app, method="POST")
    assert code.startswith("405")


def test_a_scrape_leaves_the_garbage_collector_as_it_found_it() -> None:
    observer = FleetObserver()
    observer.take(status(uuid4(), OPERATOR, "a", metrics={**host(0), "agent": snapshot(1)}))
    exposition = CachedExposition(observer, clock=lambda: NOW)
    assert gc.isenabled()
    assert exposition.body() == reference(observer)
    assert gc.isenabled()
    gc.disable()
    try:
        exposition.body()
        assert not gc.isenabled()  # an application that turned it off keeps it off
    finally:
        gc.enable()
