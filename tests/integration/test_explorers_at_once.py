"""Explorers, several at once, beside a fleet of `vox-agent` daemons (issue 38, item 5).

The broker is rendered by `vox broker render --explorer alice --explorer bob --explorer
demo-watcher`; two `mosquitto_sub` explorers (alice, bob) and the demo's own watcher
(ExplorerWatch, as `vox demo` runs it) read the fleet together for 30 s. With client ids
locked to usernames, two of them sharing one login would kick each other off every few
seconds ("already connected, closing old connection" in the broker's log); each with its
own, none is. A publish by an explorer is refused (MQTT v5: not authorized) and reaches
no one.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from tests.kits.brokerkit import Witness
from tests.kits.fleetproc import fleet_text, run_fleet
from vox_mqtt.broker.render import BrokerDir
from vox_mqtt.cli import main
from vox_mqtt.cli.localfleet import DEMO_WATCHER, ExplorerWatch
from vox_mqtt.protocol import topics

pytestmark = pytest.mark.slow

SHAPE = {"root": None, "coord": "root", "spec_a": "coord", "spec_b": "coord"}
TOGETHER = 30.0  # the done-when of issue 38: 30 s side by side
FORMAT = "%r %t %p"  # retained flag, topic, payload


def _render_explorers(broker_dir: BrokerDir) -> None:
    """Re-render as an operator would: the port and user the first render used are kept."""
    fleet_file = broker_dir.root.parent / "fleet.toml"
    names = ["--explorer", "alice", "--explorer", "bob", "--explorer", "demo-watcher"]
    assert main(["broker", "render", str(fleet_file), "--out", str(broker_dir.root), *names]) == 0


def _retained_statuses(witness: Witness, topics_wanted: set[str]) -> set[str]:
    """Return which of the topics the witness received as a retained message."""
    seen = set()
    for line in list(witness.lines):
        flag, _, rest = line.partition(" ")
        topic = rest.partition(" ")[0]
        if flag == "1" and topic in topics_wanted:
            seen.add(topic)
    return seen


def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def test_two_explorers_and_the_demo_watcher_read_together_and_write_nothing(
    tmp_path: Path,
) -> None:
    with run_fleet(
        tmp_path, fleet_text(SHAPE), before_broker=_render_explorers, start=True
    ) as procs:
        bdir = procs.broker_dir
        assert {"explorer-alice", "explorer-bob", DEMO_WATCHER} <= set(bdir.store.names())
        ids = {spec.name: spec.id for spec in procs.fleet}
        statuses = {topics.status(str(i)) for i in ids.values()}
        witnesses: list[Witness] = []
        try:

            async def together() -> ExplorerWatch:
                async with ExplorerWatch(bdir, tmp_path / "state" / DEMO_WATCHER) as watch:
                    deadline = time.monotonic() + 60
                    while not all(
                        (s := watch.status(i)) is not None and s.healthy for i in ids.values()
                    ):
                        assert time.monotonic() < deadline, "the watcher saw no ACTIVE fleet"
                        await asyncio.sleep(0.1)
                    # The fleet is up and its statuses retained: the explorers attach now.
                    for name in ("explorer-alice", "explorer-bob"):
                        witnesses.append(Witness(bdir.credentials_for(name), "vox/#", fmt=FORMAT))
                    await asyncio.sleep(TOGETHER)
                    # Still reading at the end: the heartbeats (1 s) go on arriving. The
                    # bound is generous: it only tells a live reader from a dead one.
                    seen = [watch.status(i) for i in ids.values()]
                    ages = [None if s is None else s.heartbeat_age() for s in seen]
                    assert all(a is not None and a < 15 for a in ages), ages
                    return watch

            asyncio.run(together())
            log = procs.broker.log_text()
            assert "already connected" not in log, procs.broker.log_tail(40)
            for witness in witnesses:
                assert _retained_statuses(witness, statuses) == statuses, witness.lines[:20]
            for name in ("explorer-alice", "explorer-bob", DEMO_WATCHER):
                assert f"as {bdir.credentials_for(name).username} (" in log, name

            # An explorer's publish is refused by the broker and reaches no other explorer.
            alice = bdir.credentials_for("explorer-alice")
            forged = f"forged-by-an-explorer-{time.monotonic_ns()}"
            bob = witnesses[1]
            before = len(bob.lines)
            published = subprocess.run(
                [
                    "mosquitto_pub",
                    *("-h", alice.host, "-p", str(alice.port), "-V", "5", "-q", "1"),
                    *("-u", alice.username, "-P", alice.password, "-i", alice.username),
                    *("-t", topics.status(str(ids["root"])), "-m", forged, "-r"),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert "Not authorized" in published.stderr, published
            # Statuses go on arriving (heartbeat 1 s): a forged message would be among them.
            _wait(lambda: len(bob.lines) >= before + 2 * len(ids), "more statuses at bob")
            assert not [ln for w in witnesses for ln in w.lines if forged in ln]
        finally:
            for witness in witnesses:
                witness.close()
