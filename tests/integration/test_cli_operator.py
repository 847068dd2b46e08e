"""The operator's day on a real broker: `vox send` by name and without leftovers, the inbox,
"down for" in status and watch, and --config from the environment."""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kits.agentkit import wait_for
from tests.kits.brokerkit import SecureBroker, Witness
from tests.kits.clikit import capture, configs, running_fleet, secure
from vox_mqtt.agent.tracking import SentState
from vox_mqtt.protocol import topics

__all__ = ["capture", "configs", "secure"]  # the fixtures this module borrows

pytestmark = pytest.mark.slow


def _payloads(witness: Witness, topic: str, kind: str) -> list[dict[str, Any]]:
    found = []
    for line in list(witness.lines):
        where, _, text = line.partition(" ")
        if where != topic:
            continue
        try:
            message = json.loads(text)
        except ValueError:
            continue
        if message.get("type") == kind:
            found.append(message)
    return found


async def test_send_names_the_handler_and_leaves_no_resend_behind(
    secure: SecureBroker,
    configs: dict[str, Path],
    tmp_path: Path,
    capture: Any,
) -> None:
    fleet = secure.fleet
    root, operator = fleet.root.id, fleet.operator_id
    # An independent witness of both directions between the root and the operator.
    witness = Witness(secure.creds("explorer"), "vox/+/inbox/+")
    try:
        async with AsyncExitStack() as stack:
            await running_fleet(stack, secure, tmp_path)
            await asyncio.sleep(0.5)  # the witnesses' SUBACKs
            code, out, err = await capture(
                "send", "--config", configs["operator"], "analyze", "target=acme"
            )
            assert (code, err) == (0, ""), err
            assert f"handled by root ({str(root)[:8]})" in out
            answers = topics.inbox(operator, root)
            await asyncio.sleep(0.5)  # what was on its way as the console left
            at_exit = len(_payloads(witness, answers, "command_result"))
            # Before, the root re-sent an unacknowledged answer after 0.3 s, 0.6 s, 1.2 s,
            # 2.4 s; an answer is now published once and never acknowledged.
            await asyncio.sleep(3.0)
        results = _payloads(witness, answers, "command_result")
        assert at_exit >= 1
        # Nothing re-sent once the console was gone (it was 4 copies before the fix).
        assert len(results) == at_exit, witness.lines
        assert len({r["message_id"] for r in results}) == 1
        acked = _payloads(witness, topics.inbox(root, operator), "message_acknowledged")
        assert acked == []  # nothing acknowledges an answer (docs/messages.md)
        # The console's ledger, read with no --config: names from beside the ledger.
        ledger = tmp_path / "cli-state" / "operator" / "logs.db"
        code, out, err = await capture("ledger", ledger, "tail")
        assert (code, err) == (0, "")
        assert f"root {str(root)[:8]}" in out
        assert f"{fleet.operator_name} {str(operator)[:8]}" in out
    finally:
        witness.close()


async def test_send_json_carries_the_handler_name(
    secure: SecureBroker,
    configs: dict[str, Path],
    tmp_path: Path,
    capture: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No --config: $VOX_CONFIG names the console's config.
    monkeypatch.setenv("VOX_CONFIG", str(configs["operator"]))
    async with AsyncExitStack() as stack:
        await running_fleet(stack, secure, tmp_path)
        code, out, err = await capture("send", "analyze", "target=acme", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["handled_by"], data["handled_by_name"]) == (str(secure.fleet.root.id), "root")


async def test_without_config_or_env_the_error_names_every_way(
    capture: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VOX_CONFIG", raising=False)
    if Path("/etc/vox/operator.toml").exists():
        pytest.fail("this machine has /etc/vox/operator.toml; the test needs it absent")
    code, out, err = await capture("status")
    assert (code, out) == (2, "")
    assert err == (
        "vox: error: no config: pass --config FILE, set $VOX_CONFIG, or install the operator's "
        "console config as /etc/vox/operator.toml (`vox agent render FLEET operator --out ...`)\n"
    )


async def test_inbox_marks_what_was_read_and_names_the_sender(
    secure: SecureBroker,
    configs: dict[str, Path],
    tmp_path: Path,
    capture: Any,
) -> None:
    async with AsyncExitStack() as stack:
        agents = await running_fleet(stack, secure, tmp_path)
        # The operator's session exists once it has connected (and subscribed) one time.
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "0")
        assert (code, err) == (0, "")
        assert "0 notification(s), 0 new" in out
        root = agents["root"]
        # Queued in the operator's session while no console runs; its re-sends are dupes.
        first = await root.notify_master(
            "job_found", {"title": "first", "note_to_human": "look at this"}
        )
        await wait_for(lambda: first.state is not SentState.QUEUED, timeout=10)
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "1")
        assert "1 notification(s), 1 new" in out
        assert re.search(r"● \S+ job_found from root \(vox-mqtt\): \{\"title\": \"first\"\}", out)
        assert "    look at this" in out
        second = await root.notify_master("job_found", {"title": "second"})
        await wait_for(lambda: second.state is not SentState.QUEUED, timeout=10)
        code, out, err = await capture(
            "inbox", "--config", configs["operator"], "--wait", "1", "--unread", "--json"
        )
        rows = json.loads(out)
        assert [(r["details"]["title"], r["read"], r["source_name"]) for r in rows] == [
            ("second", False, "root")
        ]
        code, out, err = await capture("inbox", "--config", configs["operator"], "--wait", "0")
        assert "2 notification(s), 0 new" in out
        assert "●" not in out


async def test_status_and_watch_say_down_for_the_same_time_and_show_the_agents_own_figures(
    secure: SecureBroker,
    configs: dict[str, Path],
    tmp_path: Path,
    capture: Any,
) -> None:
    async with AsyncExitStack() as stack:
        agents = await running_fleet(stack, secure, tmp_path)
        # The will is built at connect time: let it age before the loss, so a view that
        # took its emitted_at for the moment of the loss would be seconds off.
        await asyncio.sleep(4.0)
        assert agents["spec_a"].session is not None
        await agents["spec_a"].session.disconnect_abruptly()
        lost_at = asyncio.get_running_loop().time()
        await wait_for(lambda: agents["root"].advertised_commands() == ["analyze"])
        await wait_for(lambda: bool(agents["root"].incidents), timeout=15)
        code, out, err = await capture("status", "--config", configs["operator"], "--json")
        elapsed = asyncio.get_running_loop().time() - lost_at
        rows = {row["name"]: row for row in json.loads(out)["agents"]}
        dead, live = rows["spec_a"], rows["spec_b"]
        assert dead["status"] == "INACTIVE"
        assert dead["heartbeat_age_s"] is None
        assert dead["down_for_at_most"] is False
        # Dated by the broker's clock, the will's message expiry, which counts whole seconds
        # (docs/liveness.md, "The will's time").
        assert 0 <= dead["down_for_s"] <= elapsed + 1.5, (dead, elapsed)
        assert live["down_for_s"] is None
        assert 0 <= live["heartbeat_age_s"] < 3
        loop = asyncio.get_running_loop()
        code, table, err = await capture("status", "--config", configs["operator"], "--wide")
        table_at = loop.time()  # the table is printed as the look ends
        assert (code, err) == (0, "")
        code, tree, err = await capture("watch", "--config", configs["operator"], "--duration", "0")
        tree_at = loop.time()  # into a pipe it prints the fleet once, as its look settled
        assert (code, err) == (0, "")
    row = next(r for r in table.splitlines() if r.startswith("spec_a "))
    shown = float(re.search(r"down (?:≤ )?(\d+\.\d)s", row).group(1))  # type: ignore[union-attr]
    frame = tree[tree.rindex("operator (operator)") :]
    line = next(ln for ln in frame.splitlines() if "spec_a INACTIVE" in ln)
    watched = float(re.search(r"down for (\d+\.\d)s", line).group(1))  # type: ignore[union-attr]
    # One basis: the two numbers differ by the time between the two looks, no more.
    assert abs((watched - shown) - (tree_at - table_at)) < 1.0, (row, line)
    assert "heartbeat" not in line
    # The live agent's own CPU and memory, next to the host's.
    live_row = next(r for r in table.splitlines() if r.startswith("spec_b "))
    assert re.search(r"\d+\.\ds ago", live_row)
    assert re.search(r"\d+ MiB", live_row)
    for column in ("cpu%", "rss", "host cpu%", "host mem%"):
        assert column in table
    assert re.search(r"spec_b ACTIVE .*cpu \d+\.\d% rss \d+ MiB \(host cpu \d+%\)", frame)


async def test_a_console_state_dir_that_is_a_file_is_one_clear_line(
    configs: dict[str, Path],
    tmp_path: Path,
    capture: Any,
) -> None:
    state = tmp_path / "cli-state" / "operator"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("not a folder\n")
    code, out, err = await capture("send", "--config", configs["operator"], "analyze")
    assert (code, out) == (2, "")
    assert err == (
        f"vox: error: state dir {state}: it is a file, not a folder — move the file away or "
        "point operator.state_dir elsewhere\n"
    )
