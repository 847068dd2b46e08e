"""How long a level works on a request: its caller's deadline, else its own request_timeout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from vox_mqtt.agent.sendrules import request_time_left, time_left
from vox_mqtt.cli import main
from vox_mqtt.cli._common import EXIT_USAGE
from vox_mqtt.protocol.messages import (
    MAX_DEADLINE_SECONDS,
    MSG_CANCEL_REQUEST,
    MSG_COMMAND_REQUEST,
    CommandRequest,
    new_message,
    timeout_refused,
)

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def at(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def test_a_deadline_beyond_the_levels_timeout_is_kept_whole() -> None:
    assert time_left(at(600), 30.0, now=NOW.timestamp()) == 600.0


def test_a_deadline_within_the_levels_timeout_is_kept_too() -> None:
    assert time_left(at(4), 30.0, now=NOW.timestamp()) == 4.0


def test_without_a_deadline_the_levels_timeout_is_the_default() -> None:
    assert time_left(None, 30.0, now=NOW.timestamp()) == 30.0


def test_a_deadline_already_past_leaves_nothing() -> None:
    assert time_left(at(-5), 30.0, now=NOW.timestamp()) == 0.0


def test_a_sent_request_waits_for_its_deadline_other_messages_for_the_default() -> None:
    later = (datetime.now(UTC) + timedelta(seconds=600)).isoformat(timespec="milliseconds")
    me, peer = uuid4(), uuid4()
    carried = new_message(
        MSG_COMMAND_REQUEST,
        source=me,
        target=peer,
        details=CommandRequest(command="stuck", deadline=later),
    )
    bare = new_message(
        MSG_COMMAND_REQUEST, source=me, target=peer, details=CommandRequest(command="stuck")
    )
    cancel = new_message(
        MSG_CANCEL_REQUEST, source=me, target=peer, details={"request_id": str(uuid4())}
    )
    assert 590.0 < request_time_left(carried, 3.0) <= 600.0
    assert request_time_left(bare, 3.0) == 3.0
    assert request_time_left(cancel, 3.0) == 3.0


@pytest.mark.parametrize("timeout", ["0", "-1", str(MAX_DEADLINE_SECONDS + 1)])
def test_vox_send_refuses_a_timeout_no_deadline_may_carry(
    timeout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused before any config is read or anything is sent: a usage error, no traceback.
    missing = str(tmp_path / "none.toml")
    assert main(["send", "stuck", "--timeout", timeout, "--config", missing]) == EXIT_USAGE
    assert "--timeout must be more than 0 and at most 30 days" in capsys.readouterr().err


def test_a_timeout_is_a_deadline_within_reach_or_refused_with_why() -> None:
    # One rule for `vox send --timeout` and the console's /send (console/home/api.py).
    assert timeout_refused(0.5) is None
    assert timeout_refused(MAX_DEADLINE_SECONDS) is None
    for seconds in (0.0, -1.0, MAX_DEADLINE_SECONDS + 1.0):
        assert timeout_refused(seconds) == (
            "timeout must be more than 0 and at most 30 days (2592000 s)"
        )
