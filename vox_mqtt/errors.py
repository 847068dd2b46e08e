"""The first waves' import path of `vox_mqtt.protocol.errors`, kept for code that uses it."""

from vox_mqtt.protocol.errors import *  # noqa: F403
