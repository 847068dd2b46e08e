"""The RETIRED status `vox fleet retire` publishes (vox_mqtt/fleet/retirement.py)."""

from __future__ import annotations

import json
from uuid import uuid4

from vox_mqtt.fleet.retirement import _retired_status
from vox_mqtt.protocol import topics
from vox_mqtt.protocol.messages import AgentStatus


def test_an_agent_whose_status_was_never_seen_is_retired_with_a_valid_status() -> None:
    # It raised a ValidationError (started_at "") when the look saw no status in time.
    agent = uuid4()
    envelope = json.loads(_retired_status("gone", agent, None))
    status = AgentStatus.model_validate(envelope["details"])
    assert status.error_code == "RETIRED"
    assert status.epoch == 0
    assert envelope["target"] == str(topics.WARROOM_ID)
