"""The first waves' import path of `vox_mqtt.protocol.messages`, kept for code that uses it."""

from vox_mqtt.protocol.domain import *  # noqa: F403  (the domain payloads, split out of it)
from vox_mqtt.protocol.messages import *  # noqa: F403
