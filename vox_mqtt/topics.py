"""The first waves' import path of `vox_mqtt.protocol.topics`, kept for code that uses it."""

from vox_mqtt.protocol.topics import *  # noqa: F403
