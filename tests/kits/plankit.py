"""What the plan tests share: a message admit() must refuse (tests/unit/test_plan*.py)."""

from __future__ import annotations

from vox_mqtt.agent.plan import Admission, Reject, admit
from vox_mqtt.protocol.messages import VOXMessage
from vox_mqtt.protocol.topics import InboxTopic


def rejected(sent: VOXMessage, admission: Admission, topic: InboxTopic | None = None) -> Reject:
    """Return admit()'s plan for a message it must refuse (REJECT), its reason to be checked.

    The topic is the sender's own inbox topic at this agent unless another is given.
    """
    where = topic or InboxTopic(target=admission.me, source=sent.source)
    plan = admit(sent, where, admission)
    assert plan is not None, f"{sent.type} from {sent.source} was admitted"
    assert isinstance(plan, Reject), plan
    return plan
