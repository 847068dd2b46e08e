"""A broker reload drops no unaffected session; a re-keyed identity's old secret is cut off."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.kits.brokerkit import (
    Client,
    SecureBroker,
    add_agent,
    reload_broker,
    rerender,
    seven_agent_fleet,
    try_connect,
)

SecureFactory = Callable[..., SecureBroker]
ALLOWED = {0x00, 0x10}


def logins(secure: SecureBroker) -> dict[str, int]:
    """Return how many times each username logged in, from the broker's log."""
    counts: dict[str, int] = {}
    for line in secure.broker.log_text().splitlines():
        if "New client connected" in line:
            username = line.rsplit("u'", 1)[1].rstrip("').")
            counts[username] = counts.get(username, 0) + 1
    return counts


def test_add_and_rekey_through_a_reload_keep_every_other_session(
    secure_broker_factory: SecureFactory,
) -> None:
    secure = secure_broker_factory(seven_agent_fleet())
    f = secure.fleet
    names = [a.name for a in f]
    clients = {n: Client(secure.creds(n), session_expiry=600) for n in names}
    old_secret = secure.creds("spec_b1")
    try:
        for client in clients.values():
            assert client.connect() == 0
        before = logins(secure)
        grown = add_agent(f, "spec_a3", "coord_a")
        rerender(secure, grown, rotate=("spec_b1",))
        assert reload_broker(secure) == 0
        time.sleep(0.5)
        # The re-keyed identity's session is cut; its old secret no longer logs in.
        assert not clients["spec_b1"].connected
        assert try_connect(old_secret) >= 0x80  # type: ignore[operator]
        assert try_connect(secure.creds("spec_b1")) == 0
        # Everyone else: still connected, never logged in again, and messages still flow.
        after = logins(secure)
        for name in names:
            if name == "spec_b1":
                continue
            assert clients[name].connected, name
            username = clients[name].creds.username
            assert after.get(username) == before.get(username) == 1, name
        coord, spec = f.agent("coord_a"), f.agent("spec_a1")
        assert clients["spec_a1"].subscribe([f"vox/{spec.id}/inbox/+"]) == [0x01]
        assert clients["coord_a"].publish(f"vox/{spec.id}/inbox/{coord.id}", b"still") in ALLOWED
        assert clients["spec_a1"].wait_payload(b"still")
    finally:
        for client in clients.values():
            client.close()
