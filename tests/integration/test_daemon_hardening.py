"""One child cannot take down its branch, with the seed's tree as real `vox-agent` daemons.

An attacker holding a specialist's credentials publishes an inflated retained status
(F3), and a specialist answers with a result too large to send (F4). The witness is
the read-only explorer identity recording every status and war-room message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.brokerkit import inflated_status, publish_as_identity
from tests.kits.faultkit import (
    ANALYST,
    Deployment,
    Processes,
    Recorder,
    deploy_fleet,
    send_json,
)
from tests.kits.recorder import Seen
from vox_mqtt.broker.local import LocalBroker
from vox_mqtt.protocol import topics

pytestmark = pytest.mark.slow

SHAPE: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "root": (None, ()),
    "coordinator": ("root", ()),
    "spec_a": ("coordinator", (ANALYST, "tests.kits.roles_for_tests:Numbers")),
    "spec_b": ("coordinator", (ANALYST,)),
}


@pytest.fixture
def deployed(tmp_path: Path, broker_factory: Callable[..., LocalBroker]) -> Deployment:
    dep = deploy_fleet(tmp_path, SHAPE, heartbeat=1.0, keepalive=5)
    broker_factory(dep.conf_text(), port=dep.port)
    return dep


def start(dep: Deployment, processes: Processes, rec: Recorder) -> None:
    processes.start(dep)
    for name in dep.configs:
        rec.status(dep.id(name), status="ACTIVE", timeout=30)
    rec.status(dep.id("root"), status="ACTIVE", commands=["analyze", "numbers"], timeout=30)


def test_an_inflated_retained_status_leaves_the_branch_serving(
    deployed: Deployment, processes: Processes, tmp_path: Path
) -> None:
    dep = deployed
    root, coord, spec_a = (dep.id(n) for n in ("root", "coordinator", "spec_a"))
    with dep.recorder() as rec:
        start(dep, processes, rec)
        attacked = time.monotonic()
        creds = dep.broker_dir.credentials_for(dep.fleet.agent("spec_a").name)
        publish_as_identity(
            port=dep.port,
            username=creds.username,
            password=creds.password or "",
            topic=topics.status(spec_a),
            payload=inflated_status(dep.fleet, "spec_a"),
            tmp=tmp_path,
        )

        # The coordinator refuses it and posts one incident about the child, with why.
        def misbehaving(seen: Seen) -> bool:
            return (
                seen.topic == topics.warroom(coord, spec_a)
                and bool(seen.payload)
                and seen.json()["details"]["error_code"] == "CHILD_MISBEHAVING"
            )

        refused = rec.wait(misbehaving, after=attacked, timeout=10)
        alert = refused.json()["details"]
        assert "commands" in alert["description"]
        # Over many heartbeats the coordinator's own status stays small and ACTIVE, and
        # the root never loses it. Counted from the refusal: a heartbeat of the moment
        # before it still names the child's commands.
        time.sleep(6)
        mine = [s for s in rec.seen if s.topic == topics.status(coord) and s.at > refused.at]
        assert len(mine) >= 4
        for seen in mine:
            assert len(seen.payload) < 8192
            assert "status" not in seen.json()["details"]  # running: the presence tells
            assert seen.json()["details"]["commands"] == ["analyze"]
        assert rec.warroom(root, coord, after=attacked) == []
        # The branch serves through the other child; still one post about the first.
        for n in range(3):
            code, answer = send_json(dep, "analyze", timeout=20, target=f"t{n}")
            assert code == 0, answer
            assert answer["result"]["by"] == "spec_b"
        posts = [p for p in rec.warroom(coord, spec_a, after=attacked) if p.payload]
        assert len([p for p in posts if misbehaving(p)]) == 1
        # Client ids are locked to usernames, so the attacker's connection took the real
        # specialist's session over: at most that loss was posted too, before.
        others = [p.json()["details"]["error_code"] for p in posts if not misbehaving(p)]
        assert others in ([], ["VM_CONNECTION_LOST"])


def test_an_oversized_result_is_a_clear_command_error(
    deployed: Deployment, processes: Processes
) -> None:
    dep = deployed
    with dep.recorder() as rec:
        start(dep, processes, rec)
        epochs = {name: rec.latest_status(dep.id(name))["epoch"] for name in dep.configs}
        asked = time.monotonic()
        code, answer = send_json(dep, "numbers", timeout=20, count=30_000)
        took = time.monotonic() - asked
        assert code == 1
        assert answer["code"] == "MESSAGE_TOO_LARGE", answer
        assert "over the 262144-byte message limit" in answer["error"]
        assert took < 15  # an answer, not the operator's timeout
        code, answer = send_json(dep, "numbers", timeout=20, count=500)
        assert code == 0
        assert answer["result"] == [10**15] * 500
        # Nobody was disconnected for an oversize packet: no will, no incident, same epochs.
        time.sleep(1.5)
        assert {n: rec.latest_status(dep.id(n))["epoch"] for n in dep.configs} == epochs
        lost = [
            s for s in rec.seen if s.at > asked and s.payload and s.topic.startswith("vox/warroom/")
        ]
        assert lost == []
