"""`vox status`, `watch`, `warroom` (and `send`) against in-process agents on the real broker."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import start_agents, wait_for
from tests.kits.brokerkit import Client, SecureBroker, tree_fleet
from tests.kits.clikit import SEED, capture, configs, running_fleet, secure
from tests.kits.faultkit import TcpProxy
from tests.kits.fleetproc import REPO, child_env
from vox_mqtt.cli import main
from vox_mqtt.cli.statusview import activity
from vox_mqtt.fleet.bundles import render_agent_config
from vox_mqtt.protocol.domain import MSG_SYSTEM_FAILURE, SystemFailure
from vox_mqtt.protocol.messages import new_message, serialize
from vox_mqtt.protocol.topics import WARROOM_ID

__all__ = ["capture", "configs", "secure"]  # the fixtures this module borrows

# Looks as an agent (its own identity) need a broker that does not lock client ids.
UNLOCKED = pytest.mark.parametrize("secure", [False], indirect=True)


async def test_status_json_and_table(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    async with AsyncExitStack() as stack:
        await running_fleet(stack, secure, tmp_path)
        code, out, err = await capture("status", "--config", configs["operator"], "--json")
        assert (code, err) == (0, "")
        data = json.loads(out)
        assert data["identity"]["kind"] == "operator"
        rows = {row["name"]: row for row in data["agents"]}
        assert sorted(rows) == ["coordinator", "root", "spec_a", "spec_b"]
        spec = rows["spec_a"]
        assert spec["id"] == str(secure.fleet.agent("spec_a").id)
        assert (spec["status"], spec["epoch"], spec["healthy"]) == ("ACTIVE", 1, True)
        assert spec["commands"] == ["analyze"]
        assert 0 <= spec["heartbeat_age_s"] < 5
        assert {"cpu_percent", "memory_percent", "disk_percent"} <= set(spec["metrics"])
        # The agent's own counts ride next to the host figures (docs/metrics.md).
        assert spec["metrics"]["agent"]["v"] == 1
        assert "command_request" in spec["metrics"]["agent"]["counters"]["messages_in"]
        assert activity(spec["metrics"])[1] == "0"  # no errors
        assert rows["coordinator"]["master_id"] == str(secure.fleet.agent("root").id)

        code, out, err = await capture("status", "--config", configs["operator"], "--wide")
        assert (code, err) == (0, "")
        for word in (
            "age",
            "msg/s",
            "errors",
            "p50 cmd",
            "cpu%",
            "mem%",
            "disk%",
            "commands",
        ):
            assert word in out
        assert out.count("ACTIVE") == 4
        assert str(secure.fleet.agent("spec_b").id) in out


@UNLOCKED
async def test_watch_draws_the_tree(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    async with AsyncExitStack() as stack:
        await running_fleet(stack, secure, tmp_path)
        code, out, err = await capture("watch", "--config", configs["operator"], "--duration", "2")
        assert (code, err) == (0, "")
        # The coordinator's own look: its master on top, itself, its children; no more.
        code, mine, err = await capture(
            "watch", "--config", configs["coordinator"], "--duration", "1"
        )
        assert (code, err) == (0, "")
    last = out[out.rindex("operator (operator)") :]
    lines = last.splitlines()
    depth = {
        name: next(ln.index(name) for ln in lines if f"{name} ACTIVE" in ln)
        for name in ("root", "coordinator", "spec_a", "spec_b")
    }
    assert depth["root"] < depth["coordinator"] < depth["spec_a"] == depth["spec_b"]
    assert "epoch 1" in last
    # Into a pipe: plain lines, each "HH:MM:SS" and the agent indented by its depth.
    frame = mine.splitlines()[1:5]
    assert [ln.split()[1] for ln in frame] == [
        "root",
        "coordinator",
        "spec_a",
        "spec_b",
    ]


@UNLOCKED
async def test_warroom_lists_open_incidents_and_follows_new_posts(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    async with AsyncExitStack() as stack:
        agents = await running_fleet(stack, secure, tmp_path)
        code, out, err = await capture("warroom", "--config", configs["operator"], "--json")
        assert (code, out, err) == (0, "", "")

        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        await wait_for(lambda: agents["root"].advertised_commands() == ["analyze"])
        # The coordinator's post may come after its new advertisement: wait for it too.
        await wait_for(lambda: bool(agents["root"].incidents), timeout=15)
        code, out, err = await capture("warroom", "--config", configs["operator"], "--json")
        [row] = [json.loads(line) for line in out.splitlines()]
        assert (row["source_name"], row["subject_name"]) == ("coordinator", "spec_a")
        assert (row["error_code"], row["severity"], row["resolved"]) == (
            "VM_CONNECTION_LOST",
            "CRITICAL",
            False,
        )
        assert row["epoch"] == 1
        code, out, err = await capture("warroom", "--config", configs["operator"])
        assert "open incidents: 1" in out
        assert "VM_CONNECTION_LOST from coordinator about spec_a" in out
        # The root may read the war room too; a coordinator may not (the ACL filters it).
        code, out, err = await capture("warroom", "--config", configs["root"], "--json")
        assert len(out.splitlines()) == 1
        code, out, err = await capture("warroom", "--config", configs["coordinator"], "--json")
        assert (code, out) == (0, "")

        follow = asyncio.ensure_future(
            capture(
                "warroom",
                "--config",
                configs["operator"],
                "--follow",
                "--duration",
                "4",
                "--json",
            )
        )
        await asyncio.sleep(2.5)  # past its 2 s look at what is open
        assert agents["spec_b"].session is not None
        await agents["spec_b"].session.disconnect_abruptly()
        code, out, err = await follow
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["subject_name"], r["resolved"]) for r in rows] == [
        ("spec_a", False),
        ("spec_b", False),
    ]


async def test_looks_beside_each_other_on_a_locked_broker_kick_no_one(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    """`vox watch` and `vox status` each log in as their own read-only identity."""
    async with AsyncExitStack() as stack:
        agents = await running_fleet(stack, secure, tmp_path)
        # The watch in a process of its own: into a pipe it prints as it goes, and this
        # process's captured output is the status's alone.
        watch = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "vox_mqtt.cli", "watch"),
            *("--config", str(configs["operator"]), "--duration", "3"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=REPO,
        )
        await asyncio.sleep(1.0)
        code, out, err = await capture("status", "--config", configs["operator"], "--json")
        assert (code, err) == (0, "")
        assert len(json.loads(out)["agents"]) == 4
        watched, watch_err = await asyncio.wait_for(watch.communicate(), 60)
        assert (watch.returncode, watch_err) == (0, b"")
        assert b"root ACTIVE" in watched[watched.rindex(b"operator (operator)") :]
        assert all(agent.session is not None for agent in agents.values())
    log = secure.broker.log_text()
    assert "already connected, closing old connection" not in log


async def test_a_look_as_an_agent_on_a_locked_broker_is_refused(
    secure: SecureBroker, configs: dict[str, Path], capture: Any
) -> None:
    code, out, err = await capture("status", "--config", configs["spec_b"], "--json")
    assert (code, out) == (2, "")
    assert "locks client ids to usernames, so a look as agent spec_b" in err
    assert len(err.splitlines()) == 1


async def test_status_as_an_agent_on_a_dynsec_broker_asks_for_each_topic(
    secure_broker_factory: Any, tmp_path: Path, capture: Any
) -> None:
    # The dynsec plugin refuses `vox/+/status` to an agent; the look falls back to the
    # topics that agent may read, one by one.
    secure = secure_broker_factory(tree_fleet(SEED), fmt="dynsec", lock_client_ids=False)
    config = render_agent_config(
        secure.fleet, "spec_a", secure.dir.root, tmp_path / "spec_a.toml", tmp_path / "look"
    ).config
    async with AsyncExitStack() as stack:
        await start_agents(stack, secure, tmp_path, {}, ["coordinator", "spec_a", "spec_b"])
        code, out, err = await capture("status", "--config", config, "--json")
    assert (code, err) == (0, "")
    assert sorted(row["name"] for row in json.loads(out)["agents"]) == ["coordinator", "spec_a"]


@UNLOCKED
async def test_warroom_marks_a_post_that_breaks_the_rule(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    """An ACL widened by hand lets spec_a post about the root: `vox warroom` marks it."""
    f = secure.fleet
    spec, root = f.agent("spec_a"), f.root
    assert secure.dir.acl is not None
    own = f"topic write vox/warroom/{spec.id}/{spec.id}"
    acl = secure.dir.acl.read_text().replace(own, f"topic write vox/warroom/{spec.id}/+")
    staged = tmp_path / "acl.widened"
    staged.write_text(acl)
    pid = str(secure.broker.pid)
    args = ["broker", "reload", str(secure.dir.root), "--pid", pid, "--acl", str(staged)]
    assert main([*args, "--accept-edit"]) == 0
    async with AsyncExitStack() as stack:
        await running_fleet(stack, secure, tmp_path)
        forged = new_message(
            MSG_SYSTEM_FAILURE,
            source=spec.id,
            target=WARROOM_ID,
            details=SystemFailure(
                error_code="HEARTBEAT_STALE", severity="CRITICAL", description="forged"
            ),
        )
        attacker = Client(secure.creds("spec_a"), client_id=f"{spec.id}-forger")
        try:
            assert attacker.connect() == 0
            topic = f"vox/warroom/{spec.id}/{root.id}"
            assert await asyncio.to_thread(
                attacker.publish, topic, serialize(forged), retain=True
            ) in {0x00, 0x10}
        finally:
            attacker.close()
        code, out, err = await capture("warroom", "--config", configs["operator"], "--json")
        assert (code, err) == (0, "")
        [row] = [json.loads(line) for line in out.splitlines()]
        assert row["rule_broken"] is not None
        assert "neither itself nor its child" in row["rule_broken"]
        code, out, _ = await capture("warroom", "--config", configs["operator"])
        assert code == 0
        assert "RULE BROKEN" in out
        assert "from spec_a about root" in out


def through(config: Path, port: int) -> Path:
    """Return a copy of a console config that reaches the broker on another port."""
    text, count = re.subn(r"(?m)^port = \d+$", f"port = {port}", config.read_text())
    assert count == 1, text
    copy = config.with_name(f"via-{port}.toml")
    copy.write_text(text)
    return copy


async def test_status_waits_out_a_stalled_broker_for_every_retained_status(
    secure: SecureBroker, configs: dict[str, Path], tmp_path: Path, capture: Any
) -> None:
    async with AsyncExitStack() as stack:
        await running_fleet(stack, secure, tmp_path)
        proxy = TcpProxy(secure.broker.port)
        stack.callback(proxy.close)
        via = through(configs["operator"], proxy.port)
        code, _, _ = await capture("status", "--config", via, "--json")
        assert code == 0
        third = proxy.downstream_bytes // 3  # of what a look reads: mostly the statuses
        # The stream stops for 2 s a third of the way in: the look ends at the marker behind
        # the last retained message, not at a pause (docs/broker.md, the end of the retained).
        proxy.stall_downstream(after_bytes=third, seconds=2.0)
        code, out, err = await capture("status", "--config", via, "--json")
        assert proxy.stalls == 1
        assert (code, err) == (0, "")
        assert sorted(row["name"] for row in json.loads(out)["agents"]) == sorted(SEED)

        # A stall longer than --wait: what came is listed, and the operator is told.
        proxy.stall_downstream(after_bytes=third, seconds=3.0)
        code, out, err = await capture("status", "--config", via, "--wait", "1")
        assert proxy.stalls == 2
        assert code == 0
        assert "had not sent every retained status within 1s" in err
        assert "--wait" in err
