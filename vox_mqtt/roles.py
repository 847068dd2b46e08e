"""The first waves' import path of `vox_mqtt.agent.roles`, kept for code that uses it."""

from vox_mqtt.agent.roles import *  # noqa: F403
