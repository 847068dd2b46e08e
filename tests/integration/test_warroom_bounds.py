"""The war room is bounded at the broker: posts only about oneself and one's own children."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

from tests.kits.brokerkit import NOT_AUTHORIZED, Client, SecureBroker, Witness, seven_agent_fleet

SecureFactory = Callable[..., SecureBroker]
ALLOWED = {0x00, 0x10}


def rss_kib(pid: int) -> int:
    """Return the resident memory of a process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_forged_post_about_a_non_child_is_refused(secure_broker_factory: SecureFactory) -> None:
    """F10: a specialist posted retained CRITICAL incidents about the root."""
    secure = secure_broker_factory(seven_agent_fleet())
    f = secure.fleet
    spec, sibling, coord, root = f.agent("spec_a1"), f.agent("spec_a2"), f.agent("coord_a"), f.root
    other_branch = f.agent("spec_b1")
    witness = Witness(secure.creds("explorer"), "vox/warroom/#")
    clients = {n: Client(secure.creds(n)) for n in ("spec_a1", "coord_a")}
    try:
        for client in clients.values():
            assert client.connect() == 0
        attempts = {
            ("spec_a1", spec.id, root.id): False,
            ("spec_a1", spec.id, sibling.id): False,
            ("spec_a1", spec.id, coord.id): False,
            ("spec_a1", spec.id, other_branch.id): False,
            ("spec_a1", root.id, root.id): False,  # under someone else's name
            ("spec_a1", spec.id, spec.id): True,
            ("coord_a", coord.id, spec.id): True,
            ("coord_a", coord.id, coord.id): True,
            ("coord_a", coord.id, root.id): False,
            ("coord_a", coord.id, other_branch.id): False,
        }
        for (who, source, subject), allowed in attempts.items():
            code = clients[who].publish(f"vox/warroom/{source}/{subject}", b"CRITICAL", retain=True)
            assert (code in ALLOWED) is allowed, (who, source, subject, hex(code))
        witness.sync(clients["coord_a"], f"vox/warroom/{coord.id}/{coord.id}")
        seen = {line.split(" ", 1)[0] for line in witness.lines}
        assert seen == {
            f"vox/warroom/{spec.id}/{spec.id}",
            f"vox/warroom/{coord.id}/{spec.id}",
            f"vox/warroom/{coord.id}/{coord.id}",
        }
    finally:
        for client in clients.values():
            client.close()
        witness.close()


def test_a_flood_of_big_posts_leaves_at_most_one_retained_post(
    secure_broker_factory: SecureFactory,
) -> None:
    """F10: 100 posts of 200 KB grew the broker by 19 MB; only its own topic takes them now."""
    secure = secure_broker_factory(seven_agent_fleet())
    f = secure.fleet
    spec = f.agent("spec_a1")
    before = rss_kib(secure.broker.pid)
    body = b"x" * 200_000
    attacker = Client(secure.creds("spec_a1"), timeout=60)
    try:
        assert attacker.connect() == 0
        subjects = [f.root.id, f.agent("coord_a").id, *(uuid4() for _ in range(97)), spec.id]
        codes = [
            attacker.publish(f"vox/warroom/{spec.id}/{subject}", body, retain=True)
            for subject in subjects
        ]
    finally:
        attacker.close()
    assert codes.count(NOT_AUTHORIZED) == 99
    assert codes[-1] in ALLOWED
    reader = Client(secure.creds("explorer"))
    try:
        assert reader.connect() == 0
        reader.subscribe(["vox/warroom/#"])
        time.sleep(1.0)
        assert [m.topic for m in reader.messages] == [f"vox/warroom/{spec.id}/{spec.id}"]
    finally:
        reader.close()
    grown = rss_kib(secure.broker.pid) - before
    print(f"broker memory grew by {grown} KiB after 100 posts of 200 KB")
    assert grown < 4_000
