"""The first waves' import path of `vox_mqtt.protocol.hierarchy`, kept for code that uses it."""

from vox_mqtt.protocol.hierarchy import *  # noqa: F403
