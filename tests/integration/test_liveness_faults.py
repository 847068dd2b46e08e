"""Liveness under real failures: daemons killed, frozen, cut off; the broker restarted.

Every test runs the seed's tree (root -> coordinator -> spec_a, spec_b) as four
`vox-agent` processes on the broker rendered from the fleet (ACL, passwords), with
keepalive 5 s and heartbeat 1 s. The witness is the read-only explorer identity; the
time each detection took is printed (run with -s to see it).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.faultkit import (
    Deployment,
    Processes,
    TcpProxy,
    deploy_fleet,
    run_vox,
    send_json,
    status_json,
)
from tests.kits.livenesskit import ALL_COMMANDS, HEARTBEAT, KEEPALIVE, report, start_fleet
from tests.kits.recorder import stated
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.protocol import topics

pytestmark = pytest.mark.slow


@pytest.fixture
def deployed(
    tmp_path: Path, broker_factory: Callable[..., LocalBroker]
) -> tuple[Deployment, LocalBroker]:
    """Render the seed fleet for KEEPALIVE and HEARTBEAT and run its broker."""
    dep = deploy_fleet(tmp_path, heartbeat=HEARTBEAT, keepalive=KEEPALIVE)
    return dep, broker_factory(dep.conf_text(), port=dep.port)


def test_killed_specialist_is_lost_at_once_routed_around_and_reborn(
    deployed: tuple[Deployment, LocalBroker], processes: Processes
) -> None:
    dep, _ = deployed
    root, coord, spec_a = (dep.id(n) for n in ("root", "coordinator", "spec_a"))
    with dep.recorder() as rec:
        start_fleet(dep, processes, rec)
        epoch_a = rec.latest_status(spec_a)["epoch"]

        killed = time.monotonic()
        processes["spec_a"].signal(signal.SIGKILL)
        will = rec.status(
            spec_a, after=killed, timeout=2.0, status="INACTIVE", error_code="VM_CONNECTION_LOST"
        )
        alert = rec.wait_warroom(coord, spec_a, after=killed, timeout=2.0)
        report("SIGKILL -> INACTIVE/VM_CONNECTION_LOST (retained will)", will.at - killed)
        report("SIGKILL -> coordinator's war-room system_failure", alert.at - killed)
        assert will.json()["details"]["epoch"] == epoch_a
        post = alert.json()
        assert post["type"] == "system_failure"
        assert post["details"]["severity"] == "CRITICAL"
        assert post["details"]["error_code"] == "VM_CONNECTION_LOST"
        assert post["details"]["subject"] == str(spec_a)
        assert post["details"]["epoch"] == epoch_a
        assert alert.retain is False  # live delivery; the broker keeps it retained as well

        # The dead child's commands leave the coordinator's and the root's advertisements.
        rec.status(coord, after=killed, status="ACTIVE", commands=["analyze"])
        rec.status(root, after=killed, status="ACTIVE", commands=["analyze"])
        for _ in range(2):
            code, answer = send_json(dep, "analyze", timeout=10, target="invoice.pdf")
            assert code == 0, answer
            assert answer["result"]["by"] == "spec_b"
            assert answer["handled_by"] == str(root)

        # Both gone: nothing advertises `analyze` any more, but the coordinator reports it
        # down, so the root answers TARGET_INACTIVE, not NO_ROUTE (REQ-001-US-002-008).
        both = time.monotonic()
        processes["spec_b"].signal(signal.SIGKILL)
        rec.status(root, after=both, status="ACTIVE", commands=[])
        code, answer = send_json(dep, "analyze", timeout=10, target="invoice.pdf")
        assert code == 1
        assert answer == {"ok": False, "code": "TARGET_INACTIVE", "error": answer["error"]}
        assert "below coordinator is down" in answer["error"]

        # Reborn: a higher epoch, the incident resolved and its retained post cleared.
        restarted = time.monotonic()
        processes["spec_a"].start()
        birth = rec.status(
            spec_a, after=restarted, status="ACTIVE", min_epoch=epoch_a + 1, timeout=20
        )
        resolution = rec.wait_warroom(coord, spec_a, resolved=True, after=restarted)
        cleared = rec.wait_warroom(coord, spec_a, resolved=None, after=restarted)
        report("restart -> ACTIVE with a higher epoch", birth.at - restarted)
        assert resolution.json()["details"]["severity"] == "INFO"
        assert cleared.at >= resolution.at
        code, answer = send_json(dep, "echo", timeout=10, text="hi")
        assert (code, answer["result"]["text"]) == (0, "hi")

        # One alert per incident: many heartbeats passed while spec_a was down.
        posts = [s for s in rec.warroom(coord, spec_a, after=killed) if s.at < restarted]
        assert len(posts) == 1, [p.payload for p in posts]

    statuses = status_json(dep.operator_config)
    assert statuses["spec_a"]["status"] == "ACTIVE"
    assert statuses["spec_b"]["status"] == "INACTIVE"
    assert statuses["spec_b"]["error_code"] == "VM_CONNECTION_LOST"
    out = run_vox("warroom", "--config", dep.operator_config, "--json")
    assert out.returncode == 0, out.stderr
    open_now = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["subject_name"], r["error_code"]) for r in open_now] == [
        ("spec_b", "VM_CONNECTION_LOST")
    ]


def test_frozen_and_cut_off_specialists_go_stale_then_inactive_and_recover(
    deployed: tuple[Deployment, LocalBroker], processes: Processes
) -> None:
    dep, _ = deployed
    proxy = TcpProxy(dep.port)
    dep.edit("spec_a", port=proxy.port)  # spec_a reaches the broker only through the proxy
    coord, spec_a, spec_b = (dep.id(n) for n in ("coordinator", "spec_a", "spec_b"))
    bound = 1.5 * KEEPALIVE + 10
    try:
        with dep.recorder() as rec:
            start_fleet(dep, processes, rec)
            epochs = {n: rec.latest_status(dep.id(n))["epoch"] for n in ("spec_a", "spec_b")}
            # The coordinator must have heard each child live, not only its retained birth:
            # a child known only from retained news gets the reconnect grace before a STALE
            # alert (so a broker restart raises none), and would then be reported by its will.
            # Its presence, not its full status: only the presence tells the state (docs/
            # liveness.md, "Which topic tells"), and a child frozen between the two halves
            # of its birth was never ACTIVE to its master.
            coordinator_up = rec.status(coord, status="ACTIVE", timeout=30).at
            for name in ("spec_a", "spec_b"):
                alive = topics.presence(dep.id(name))
                rec.wait(
                    lambda seen, alive=alive: (
                        seen.topic == alive and stated(seen)["status"] == "ACTIVE"
                    ),
                    after=coordinator_up + 0.05,
                    timeout=10,
                    what=f"presence ACTIVE of {name}",
                )

            faulted = time.monotonic()
            proxy.blackhole()  # a cut cable: no FIN, no RST, just silence
            processes["spec_b"].signal(signal.SIGSTOP)  # a frozen VM
            for name, subject in (("spec_a", spec_a), ("spec_b", spec_b)):
                stale = rec.wait_warroom(coord, subject, after=faulted, timeout=bound)
                details = stale.json()["details"]
                assert details["error_code"] == "HEARTBEAT_STALE", details
                report(f"{name} cut off/frozen -> coordinator's STALE alert", stale.at - faulted)
            rec.status(dep.id("coordinator"), after=faulted, commands=[], timeout=bound)
            for name, subject in (("spec_a", spec_a), ("spec_b", spec_b)):
                will = rec.status(
                    subject,
                    after=faulted,
                    timeout=bound,
                    status="INACTIVE",
                    error_code="VM_CONNECTION_LOST",
                )
                report(f"{name} cut off/frozen -> broker's will (INACTIVE)", will.at - faulted)

            healed = time.monotonic()
            proxy.heal()
            processes["spec_b"].signal(signal.SIGCONT)
            for name, subject in (("spec_a", spec_a), ("spec_b", spec_b)):
                back = rec.status(
                    subject, after=healed, status="ACTIVE", min_epoch=epochs[name] + 1, timeout=30
                )
                rec.wait_warroom(coord, subject, resolved=True, after=healed, timeout=10)
                rec.wait_warroom(coord, subject, resolved=None, after=healed, timeout=10)
                report(f"{name} healed/continued -> ACTIVE again", back.at - healed)
                # The STALE alert and the will that followed were one incident, one post.
                posts = [s for s in rec.warroom(coord, subject, after=faulted) if s.at < healed]
                assert len(posts) == 1
            rec.status(dep.id("root"), after=healed, commands=ALL_COMMANDS, timeout=10)
    finally:
        proxy.close()


def test_after_a_broker_restart_every_agent_is_back_and_the_view_is_whole(
    deployed: tuple[Deployment, LocalBroker], processes: Processes
) -> None:
    dep, broker = deployed
    names = ["root", "coordinator", "spec_a", "spec_b"]
    with dep.recorder() as rec:
        start_fleet(dep, processes, rec)
        before = {n: rec.latest_status(dep.id(n))["epoch"] for n in names}
        restarted = time.monotonic()
        # An outage longer than the staleness bound: the agents' backoff grows meanwhile.
        broker.stop()
        time.sleep(3 * HEARTBEAT)
        broker.start()
        back_at = time.monotonic()
        for name in names:
            back = rec.status(
                dep.id(name),
                after=restarted,
                status="ACTIVE",
                min_epoch=before[name] + 1,
                timeout=30,
            )
            report(f"broker back after a 3 s outage -> {name} reborn", back.at - back_at)
        rec.status(dep.id("root"), after=restarted, commands=ALL_COMMANDS, timeout=15)
        statuses = status_json(dep.operator_config)
        alerts = [s for s in rec.seen if s.topic.startswith("vox/warroom/") and s.at > restarted]
    assert sorted(statuses) == sorted(names)
    assert {n: s["status"] for n, s in statuses.items()} == dict.fromkeys(names, "ACTIVE")
    # No agent's reconnect became a war-room incident, and none is open now.
    assert alerts == []
    out = run_vox("warroom", "--config", dep.operator_config, "--json")
    assert (out.returncode, out.stdout) == (0, ""), out.stderr
    code, answer = send_json(dep, "analyze", timeout=10, target="after-restart")
    assert code == 0, answer
